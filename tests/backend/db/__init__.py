"""Tests of the database: checkpoints, retention steps, rollups, query plans, PostgreSQL."""
