"""Bulk writes through the database driver: SQLite executemany, PostgreSQL COPY via staging.

SQLAlchemy's per-statement and per-row work cost more than the databases' own work at
20,000 spans per second, so the ingest path hands plain tuples to the driver. The SQL
used here (ON CONFLICT ... DO NOTHING / DO UPDATE, excluded.*) means the same in SQLite
and PostgreSQL.
"""

from collections.abc import Sequence
from functools import cache
from itertools import chain

from sqlalchemy import Connection, Engine, Table, event

STAGE_PREFIX = "kvscope_in_"
"""PostgreSQL temporary tables that COPY fills before one INSERT ... SELECT moves the rows."""

DO_NOTHING = "ON CONFLICT DO NOTHING"
"""Rows already stored (an exporter's retry) are skipped."""

SQLITE_ROWS_PER_STATEMENT = 32
"""SQLite: rows per multi-row INSERT; the rest of a batch goes in statements of 16, 8, 4, 2
and 1 rows (its size in binary).

SQLite pays a cost per statement run (executemany runs one per row), more on a table with a
trigger, and more the more indexes that table has (timeline points, with a trigger that never
fired: 2.5 us more a row by executemany, 1 in 32-row statements). The ingest write took 16.4
instead of 19.3 us per span in-process (16 rows did as well, 128 worse). A table has at most
six statements, kept in the driver's statement cache; one per remainder size would be compiled
again and again, and the remainders by executemany were a third of the request, lookup and
transfer rows of a 512-span batch (51 of each: 32 + 19). Not PostgreSQL: its upsert refuses
to touch one row twice in one statement, and its plain inserts go by COPY."""

COPY_MIN_ROWS = 16
"""Below this many rows a COPY round trip costs more than executemany saves."""


class BulkCursor:
    """Writes row tuples inside the caller's transaction through the driver's cursor."""

    def __init__(self, connection: Connection, staged: Sequence[Table] = ()) -> None:
        self.postgres = connection.dialect.name == "postgresql"
        self.staged = {table.name for table in staged} if self.postgres else set()
        self.marker = "%s" if self.postgres else "?"
        self.cursor = connection.connection.cursor()

    def insert(
        self,
        table: Table,
        columns: Sequence[str],
        rows: list[tuple],
        on_conflict: str = DO_NOTHING,
    ) -> int:
        """Inserts rows (tuples in `columns` order); rows already stored follow on_conflict.
        Returns the rows inserted or updated (those DO NOTHING skipped not counted)."""
        if not rows:
            return 0
        names = ", ".join(columns)
        copy = on_conflict == DO_NOTHING and table.name in self.staged
        if copy and len(rows) >= COPY_MIN_ROWS:
            return self._copy_insert(table, names, rows, on_conflict)
        insert = f"INSERT INTO {table.name} ({names}) VALUES "
        if self.postgres:
            self.cursor.executemany(
                f"{insert}{_values(len(columns), 1, self.marker)} {on_conflict}", rows
            )
            return self.cursor.rowcount
        stored, at, size = 0, 0, SQLITE_ROWS_PER_STATEMENT
        while at < len(rows):
            while at + size > len(rows):
                size //= 2
            statement = f"{insert}{_values(len(columns), size)} {on_conflict}"
            self.cursor.execute(statement, list(chain.from_iterable(rows[at : at + size])))
            stored += self.cursor.rowcount
            at += size
        return stored

    def _copy_insert(self, table: Table, names: str, rows: list[tuple], on_conflict: str) -> int:
        stage = STAGE_PREFIX + table.name
        with self.cursor.copy(f"COPY {stage} ({names}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)
        # DO NOTHING also skips a row repeated within the batch. The stage is emptied by
        # truncation at commit (a DELETE would leave dead rows that no autovacuum of a
        # temporary table ever removes, and every later batch would scan them).
        self.cursor.execute(
            f"INSERT INTO {table.name} ({names}) SELECT {names} FROM {stage} {on_conflict}"
        )
        return self.cursor.rowcount

    def execute(self, sql: str, parameters: Sequence = ()) -> Sequence[tuple]:
        """One statement written with '?' markers; returns its rows (empty for writes)."""
        if self.postgres:
            sql = sql.replace("?", "%s")
        self.cursor.execute(sql, parameters)
        return self.cursor.fetchall() if self.cursor.description else []

    def executemany(self, sql: str, rows: list[tuple]) -> None:
        if self.postgres:
            sql = sql.replace("?", "%s")
        self.cursor.executemany(sql, rows)


@cache
def _values(columns: int, rows: int, marker: str = "?") -> str:
    """The VALUES list of `rows` rows of `columns` markers each."""
    row = f"({', '.join([marker] * columns)})"
    return ", ".join([row] * rows)


def add_postgres_stages(engine: Engine, tables: Sequence[Table]) -> None:
    """Every new PostgreSQL connection gets a staging table per bulk-loaded table.

    They are created and committed when the connection opens, so no rolled-back batch
    can take them away; the rows COPYed into them go at commit or rollback.
    """
    if engine.dialect.name != "postgresql":
        return
    statements = [_stage_ddl(table, engine) for table in tables]

    @event.listens_for(engine, "connect")
    def _create_stages(dbapi_connection, _record) -> None:
        with dbapi_connection.cursor() as cursor:
            for statement in statements:
                cursor.execute(statement)
        dbapi_connection.commit()


def _stage_ddl(table: Table, engine: Engine) -> str:
    columns = ", ".join(
        f"{column.name} {column.type.compile(engine.dialect)}"
        for column in table.columns
        if not column.primary_key
    )
    return (
        f"CREATE TEMPORARY TABLE IF NOT EXISTS {STAGE_PREFIX}{table.name} ({columns}) "
        "ON COMMIT DELETE ROWS"
    )
