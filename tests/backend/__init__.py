"""Tests of kvscope.backend: OTLP ingest, state rebuilding, API, limits, PostgreSQL."""
