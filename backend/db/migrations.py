"""Versioned schema migrations in a small table of our own (no alembic dependency)."""

import time
from collections.abc import Callable

from sqlalchemy import Connection, Engine, text
from sqlmodel import SQLModel

from kvscope.backend.db import (
    kv_waits,
    models,  # noqa: F401  (registers the tables on SQLModel.metadata)
    number_keys,
    read_schema,
    rollups,
    span_counts,
    time_keys,
)
from kvscope.backend.db.identities import migrate_ids_to_bigint, widen_ids

widen_ids(SQLModel.metadata)  # before any table is created, here or by a migration

VERSION_TABLE = "kvscope_schema_version"

# What a migration function returns is not read (some return the names of what they added).
Migration = tuple[int, str, Callable[[Connection], object]]

# Later schema changes append (version, description, function running explicit DDL) here.
# A fresh database gets every table from the models at once and is stamped with the latest
# version, so no migration ever runs against tables that already have its change.
MIGRATIONS: list[Migration] = [
    (
        1,
        "spans, requests, timeline points, transfers, failures, leases, blocks, seq ranges",
        lambda connection: None,
    ),
    (
        3,
        "64-bit ids and id sequences on PostgreSQL",
        lambda connection: migrate_ids_to_bigint(connection, SQLModel.metadata),
    ),
    # The read side (it was to be 2; 4 also reaches databases stamped 3 before it existed).
    (4, "lookups, latencies and the indexes of every dashboard query", read_schema.add_missing),
    (5, "blocks' KV cache group; the tier health spans' index", read_schema.add_missing),
    (6, "per-second series rollups kept by triggers; lookups by request", rollups.migrate),
    (7, "token accounting: lookups' local hits", read_schema.add_missing),
    (8, "span-derived tables' unique keys led by time, not by random trace ids", time_keys.migrate),
    (
        9,
        "spans per second in the rollups; the span table's narrow time index dropped",
        span_counts.migrate,
    ),
    (10, "KV waits counted by the writer per batch, not by a row trigger", kv_waits.migrate),
    (
        11,
        "timeline points indexed by time only for vLLM's cached-token counts",
        lambda connection: read_schema.replace_indexes(connection, ["ix_point_kind_time"]),
    ),
    (12, "a request's rows found by its number, not by its random id", number_keys.number_rows),
    (
        13,
        "request numbers found by a hash of the id; the request table keyed by number",
        number_keys.key_by_number,
    ),
]

MIGRATION_LOCK = 0x6B7673636F7065  # 'kvscope'
"""PostgreSQL advisory lock key held while migrating: backends starting together take turns."""

_LOCK = text("SELECT pg_advisory_xact_lock(:key)")


def latest_version() -> int:
    return MIGRATIONS[-1][0]


def current_version(connection: Connection) -> int | None:
    """The schema version stamped in the database, or None for a database kvscope never used."""
    if not connection.dialect.has_table(connection, VERSION_TABLE):
        return None
    found = connection.execute(text(f"SELECT MAX(version) FROM {VERSION_TABLE}")).scalar()
    return int(found) if found is not None else None


def migrate(engine: Engine) -> int:
    """Brings the schema to the latest version; returns that version. Safe to run from
    several backends at once: PostgreSQL serialises them on an advisory lock (released at
    commit), SQLite on its write lock, taken first (BEGIN IMMEDIATE)."""
    with engine.begin() as connection:
        if connection.dialect.name == "postgresql":
            connection.execute(_LOCK, {"key": MIGRATION_LOCK})
        elif connection.dialect.name == "sqlite":
            # pysqlite begins a transaction only before DML: DDL would run unlocked.
            connection.exec_driver_sql("BEGIN IMMEDIATE")
        connection.execute(
            text(
                f"CREATE TABLE IF NOT EXISTS {VERSION_TABLE} "
                "(version INTEGER PRIMARY KEY, description TEXT NOT NULL, "
                "applied_ns BIGINT NOT NULL)"
            )
        )
        version = current_version(connection)
        if version is None:
            SQLModel.metadata.create_all(connection)
            _stamp(connection, latest_version(), "created from models")
            return latest_version()
        if version > latest_version():
            raise RuntimeError(
                f"database schema is version {version}, newer than this kvscope "
                f"({latest_version()}): upgrade kvscope or point DATABASE_URL elsewhere"
            )
        for number, description, apply in MIGRATIONS:
            if number > version:
                apply(connection)
                _stamp(connection, number, description)
    return latest_version()


def _stamp(connection: Connection, version: int, description: str) -> None:
    connection.execute(
        text(
            f"INSERT INTO {VERSION_TABLE} (version, description, applied_ns) "
            "VALUES (:version, :description, :applied_ns)"
        ),
        {"version": version, "description": description, "applied_ns": time.time_ns()},
    )
