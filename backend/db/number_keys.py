"""Migrations 12 and 13: an older database's rows numbered by request (db/request_numbers.py).

12 gave each (engine, request id) a number, set it on every row of the request and indexed the
rows by it in place of the request id. 13 finds numbers by a hash of the request id, not by an
index of the ids, and leads the request table's unique key by the number.
"""

from sqlalchemy import Connection, inspect, text
from sqlmodel import SQLModel

from kvscope.backend.db import read_schema, rollups
from kvscope.backend.db.rebuild import rebuild_sqlite
from kvscope.backend.db.request_numbers import COLUMN, NO_REQUEST, NUMBERED, hash_sql

UNREAD = ("ix_latency_request",)
"""Indexes by request id no query reads (vLLM's latencies are read by time), dropped by 12."""

OLD_KEYS = {
    # table: its unique constraint that migration 13 replaces
    "kv_request": "uq_request_span",
    "request_number": "uq_request_number",
}
_OLD_REQUEST_INDEX = "ix_request_request_no"
"""12's index of the request table by number: 13's unique key is led by the number."""


def number_rows(connection: Connection) -> None:
    """Migration 12: the number table and columns, every stored (engine, request id) numbered
    and the number set on its rows, the indexes by request id dropped, the rollup triggers
    installed again (they match a request's rows by number). One pass over each table."""
    read_schema.add_missing(connection)
    pairs = " UNION ".join(
        f"SELECT COALESCE(engine_id, '') AS engine_id, request_id FROM {table} "
        "WHERE request_id IS NOT NULL"
        for table in NUMBERED
    )
    hashed = hash_sql(connection, "p.request_id")
    connection.execute(
        text(
            "INSERT INTO request_number (request_hash, engine_id, request_id) "
            f"SELECT {hashed}, p.engine_id, p.request_id FROM ({pairs}) AS p "
            f"WHERE NOT EXISTS (SELECT 1 FROM request_number n WHERE n.request_hash = {hashed} "
            "AND n.request_id = p.request_id AND n.engine_id = p.engine_id) "
            "ORDER BY p.request_id, p.engine_id"
        )
    )
    for table, old_indexes in NUMBERED.items():
        connection.execute(
            text(
                f"UPDATE {table} SET {COLUMN} = (SELECT n.id FROM request_number n "
                f"WHERE n.request_hash = {hash_sql(connection, f'{table}.request_id')} "
                f"AND n.request_id = {table}.request_id "
                f"AND n.engine_id = COALESCE({table}.engine_id, '')) "
                "WHERE request_id IS NOT NULL"
            )
        )
        for index in old_indexes:
            connection.execute(text(f"DROP INDEX IF EXISTS {index}"))
    for index in UNREAD:
        connection.execute(text(f"DROP INDEX IF EXISTS {index}"))
    _unnumbered_requests(connection)
    rollups.install(connection)


def key_by_number(connection: Connection) -> None:
    """Migration 13: the number table's unique (request id, engine) and the request table's
    unique (trace id, span id) dropped; numbers hashed, the request table keyed by number.
    PostgreSQL alters the tables in place; SQLite cannot drop a table's UNIQUE constraint, so
    a table that has one is rebuilt (rows copied, ids kept). Idempotent."""
    _unnumbered_requests(connection)
    if connection.dialect.name == "postgresql":
        for table, constraint in OLD_KEYS.items():
            connection.execute(text(f"ALTER TABLE {table} DROP CONSTRAINT IF EXISTS {constraint}"))
    else:
        # Triggers of other tables read these ones: none may exist while a table is missing.
        for name, *_ in rollups.TRIGGERS:
            connection.exec_driver_sql(f"DROP TRIGGER IF EXISTS {name}")
        hashed = {"request_hash": hash_sql(connection, "request_id")}
        for table, constraint in OLD_KEYS.items():
            keys = {key["name"] for key in inspect(connection).get_unique_constraints(table)}
            if constraint in keys:
                rebuild_sqlite(connection, SQLModel.metadata.tables[table], hashed)
    connection.execute(text(f"DROP INDEX IF EXISTS {_OLD_REQUEST_INDEX}"))
    read_schema.add_missing(connection)  # the hash column, its index, the request table's key
    connection.execute(
        text(
            f"UPDATE request_number SET request_hash = {hash_sql(connection, 'request_id')} "
            "WHERE request_hash IS NULL"
        )
    )
    rollups.install(connection)


def _unnumbered_requests(connection: Connection) -> None:
    """Request rows of no request id get NO_REQUEST: the table's unique key is led by it."""
    connection.execute(
        text(f"UPDATE kv_request SET {COLUMN} = {NO_REQUEST} WHERE {COLUMN} IS NULL")
    )
