"""64-bit row ids on every database: declared for new tables, migrated for old PostgreSQL ones.

PostgreSQL's SERIAL is 32-bit, and an upsert (INSERT ... ON CONFLICT) takes a sequence value
even when it updates: block and lease events used up int4 in about 30 h at 20k rows/s, then
every batch failed. SQLite's INTEGER PRIMARY KEY is already 64-bit (and must stay spelled
INTEGER to remain the rowid).
"""

from sqlalchemy import BigInteger, Connection, Integer, MetaData, text

ID_TYPE = BigInteger().with_variant(Integer(), "sqlite")
"""BIGSERIAL on PostgreSQL, the rowid on SQLite."""

_ID_COLUMNS = text(
    "SELECT table_name FROM information_schema.columns "
    "WHERE table_schema = current_schema() AND column_name = 'id' AND data_type = 'integer' "
    "AND table_name = ANY(:tables)"
)
_SEQUENCE_OF = text("SELECT pg_get_serial_sequence(:table, 'id')")
# DDL cannot bind identifiers: the names come from our own metadata, quoted by the dialect,
# and pg_get_serial_sequence returns an already quoted name.
_WIDEN_COLUMN = "ALTER TABLE {table} ALTER COLUMN id TYPE BIGINT"
_WIDEN_SEQUENCE = "ALTER SEQUENCE {sequence} AS BIGINT"


def widen_ids(metadata: MetaData) -> None:
    """Every table's integer `id` primary key becomes ID_TYPE (tables added later too)."""
    for table in metadata.tables.values():
        column = table.columns.get("id")
        if column is not None and column.primary_key and isinstance(column.type, Integer):
            column.type = ID_TYPE


def migrate_ids_to_bigint(connection: Connection, metadata: MetaData) -> list[str]:
    """ALTERs each 32-bit id column and its sequence to 64 bits (PostgreSQL; a no-op on
    SQLite); returns the tables changed. Each ALTER rewrites its table under an exclusive
    lock: minutes for tens of millions of rows, once."""
    if connection.dialect.name != "postgresql":
        return []
    names = [name for name, table in metadata.tables.items() if "id" in table.columns]
    narrow = connection.execute(_ID_COLUMNS, {"tables": names}).scalars().all()
    quote = connection.dialect.identifier_preparer.quote
    for name in sorted(narrow):
        connection.execute(text(_WIDEN_COLUMN.format(table=quote(name))))
        sequence = connection.execute(_SEQUENCE_OF, {"table": quote(name)}).scalar()
        if sequence:
            # The sequence has a type of its own (max 2^31-1 for SERIAL's); widening it moves
            # that maximum to bigint's.
            connection.execute(text(_WIDEN_SEQUENCE.format(sequence=sequence)))
    return sorted(narrow)
