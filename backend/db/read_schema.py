"""Migration step: the tables, columns and indexes the models declare that a database lacks."""

from sqlalchemy import Connection, inspect, text
from sqlmodel import SQLModel

from kvscope.backend.db import models  # noqa: F401  (registers the tables on SQLModel.metadata)


def add_missing(connection: Connection) -> None:
    """Creates every declared table and index not yet in the database; idempotent.

    New columns must be nullable (older rows have none). Rows stored before the upgrade are
    not back-filled: lookups and latencies start with it.
    """
    SQLModel.metadata.create_all(connection, checkfirst=True)
    inspector = inspect(connection)
    for table in SQLModel.metadata.sorted_tables:
        present = {column["name"] for column in inspector.get_columns(table.name)}
        for column in table.columns:
            if column.name not in present and column.nullable:
                kind = column.type.compile(connection.dialect)
                connection.execute(
                    text(f"ALTER TABLE {table.name} ADD COLUMN {column.name} {kind}")
                )
        for index in table.indexes:
            index.create(connection, checkfirst=True)


def replace_indexes(connection: Connection, dropped: list[str]) -> None:
    """Drops indexes the models no longer declare, then adds what they declare."""
    for name in dropped:
        connection.execute(text(f"DROP INDEX IF EXISTS {name}"))
    add_missing(connection)
