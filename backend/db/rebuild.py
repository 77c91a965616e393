"""SQLite cannot drop a UNIQUE constraint: a migration that changes a table's key rebuilds it."""

from sqlalchemy import Connection, Table, inspect

_OLD = "kvscope_rebuild_old_"


def rebuild_sqlite(
    connection: Connection, table: Table, values: dict[str, str] | None = None
) -> None:
    """Replaces `table` with one created from its model, its rows copied in id order (ids
    kept). Columns the old table has are copied as they are; `values` gives SQL over the old
    table's columns for others, or for those that change. Columns neither names are left to
    their defaults (a migration after this one adds them to older tables). The caller drops
    the triggers that read the table first and installs them again after."""
    values = values or {}
    old = _OLD + table.name
    present = {column["name"] for column in inspect(connection).get_columns(table.name)}
    # Named indexes only (a UNIQUE constraint's autoindex goes with the table); their names
    # go to the new table's indexes.
    for index in inspect(connection).get_indexes(table.name):
        connection.exec_driver_sql(f'DROP INDEX "{index["name"]}"')
    connection.exec_driver_sql(f"ALTER TABLE {table.name} RENAME TO {old}")
    table.create(connection)
    columns = [c.name for c in table.columns if c.name in values or c.name in present]
    sources = ", ".join(values.get(column, column) for column in columns)
    connection.exec_driver_sql(
        f"INSERT INTO {table.name} ({', '.join(columns)}) SELECT {sources} FROM {old} ORDER BY id"
    )
    connection.exec_driver_sql(f"DROP TABLE {old}")
