"""Tests of the ingest stages: bodies, bounds, workers, group commit, gRPC, crash safety."""
