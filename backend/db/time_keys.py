"""Migration step: the span-derived tables' unique keys led by time, not by random trace ids.

A retried batch is recognised by its spans' (trace_id, span_id), but OpenTelemetry's trace ids
are random: a unique index led by them takes every insert at a random place, and once it
outgrows the page cache each batch reads and rewrites pages all over it (a 10M-span fill ended
at 0.54 of its empty-database rate). The same key led by the row's own time appends, and a
retry carries the same times, so it still matches. The derived tables' time indexes are then
that key's first column, and go; the span table kept its narrow one for the summary's count
until migration 9 moved that count to the rollups (backend/db/span_counts.py).
"""

from sqlalchemy import Connection, inspect, text
from sqlmodel import SQLModel

from kvscope.backend.db import (
    kv_waits,
    models,  # noqa: F401  (registers the tables on SQLModel.metadata)
    read_schema,
    rollups,
)
from kvscope.backend.db.rebuild import rebuild_sqlite

REKEYED = {
    # table: (its old unique key's constraint name, its old time index if that goes)
    "span": ("uq_span_trace_span", None),
    "timelinepoint": ("uq_point_source", "ix_point_time"),
    "transfer": ("uq_transfer_span", "ix_transfer_start_ns"),
    "failure": ("uq_failure_source", "ix_failure_time_ns"),
    "lookup": ("uq_lookup_span", "ix_lookup_time"),
    "latency": ("uq_latency_span", "ix_latency_time"),
}
"""The tables whose unique key migration 8 leads by time."""


def migrate(connection: Connection) -> None:
    """PostgreSQL drops the old key and index and builds the new one in place; SQLite cannot
    drop a table's UNIQUE constraint, so each table without the new key is rebuilt (its rows
    copied, ids kept). Minutes for tens of millions of rows, once; the rollup triggers are
    installed again. Idempotent."""
    tables = [SQLModel.metadata.tables[name] for name in REKEYED]
    if connection.dialect.name == "postgresql":
        for table in tables:
            constraint, index = REKEYED[table.name]
            connection.execute(
                text(f"ALTER TABLE {table.name} DROP CONSTRAINT IF EXISTS {constraint}")
            )
            if index is not None:
                connection.execute(text(f"DROP INDEX IF EXISTS {index}"))
        read_schema.add_missing(connection)  # the new keys
        return
    # Triggers of other tables read these ones: none may exist while a table is missing.
    for name, *_ in rollups.TRIGGERS:
        connection.exec_driver_sql(f"DROP TRIGGER IF EXISTS {name}")
    kv_waits.drop_trigger(connection)  # a version 7 database has it; 10 would drop it anyway
    for table in tables:
        (key,) = [index.name for index in table.indexes if index.unique]
        assert key is not None  # the models name every unique index
        if not inspect(connection).has_index(table.name, key):
            rebuild_sqlite(connection, table)
    rollups.install(connection)
