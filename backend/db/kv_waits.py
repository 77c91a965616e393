"""KV waits in the series rollups, counted per batch: each request's wait before the batch's
timeline points out, its wait after them in.

A request's KV wait runs from its first blocks_allocated to its first transfer_complete or
resumed; it is counted in the allocation's second, in the bin of its length in ms (see
rollups.bin_sql). A batch looks up the first allocation and first load of each request it
brings such points for, inserts its points, and looks again: only a request whose firsts moved
changes the counts (an exporter's retry moves nothing). Taking the wait out and putting it in
from the two looks is what a row trigger did point by point, summed. The trigger cost 2 us a
span of the write at 0.7 points a span (SQLite runs a row trigger's program for every row of
its table; six points in seven were of other kinds); the two looks cost 0.5. The writer
holds the requests' locks (request_locks), so another backend's batch of the same request
waits for this one's commit.
"""

import json
from collections import Counter
from collections.abc import Iterable, Sequence

from sqlalchemy import Connection, Table

from kvscope.backend.db.bulk import BulkCursor
from kvscope.backend.db.rollups import RESOLUTION_NS, add_sql, bin_sql

METRIC = "kv_wait"
ALLOCATED = "blocks_allocated"
LOADED = ("transfer_complete", "resumed")
KINDS = (ALLOCATED, *LOADED)
"""The timeline points a KV wait is made of."""

Firsts = tuple[int | None, int | None]
"""A request's first allocation and first load, ns (None: none yet)."""

_KINDS_SQL = ", ".join(f"'{kind}'" for kind in KINDS)
_FIRSTS = (
    "SELECT request_no, "
    f"MIN(CASE WHEN point = '{ALLOCATED}' THEN time_ns END), "
    f"MIN(CASE WHEN point != '{ALLOCATED}' THEN time_ns END) "
    "FROM timelinepoint {by} WHERE request_no IN ({requests}) "
    f"AND point IN ({_KINDS_SQL}) GROUP BY request_no"
)
_BY_REQUEST = {
    # Named for SQLite, which without statistics may pick a worse index (it took one of all
    # points by kind and time, and read every allocation stored).
    False: _FIRSTS.format(
        by="INDEXED BY ix_point_request_no", requests="SELECT value FROM json_each(?)"
    ),
    True: _FIRSTS.format(by="", requests="SELECT unnest(CAST(? AS bigint[]))"),
}


def _count_sql(postgres: bool) -> str:
    """One wait (allocated, loaded, engine, count) into its second's and bin's counter."""
    given = (
        "SELECT CAST(? AS BIGINT) AS a, CAST(? AS BIGINT) AS l, CAST(? AS TEXT) AS e, "
        "CAST(? AS INTEGER) AS n"
    )
    # The trigger's expressions on its column types (PostgreSQL: bigint / 1e6 is numeric).
    waits = (
        f"SELECT a, e, n, (CASE WHEN l > a THEN (l - a) / 1e6 ELSE 0 END) AS wait FROM ({given}) g"
    )
    sql = add_sql(
        f"SELECT '{METRIC}', w.a - w.a % {RESOLUTION_NS}, w.e, "
        f"CAST({bin_sql('w.wait', postgres)} AS TEXT), w.n, 0, 0, 0 FROM ({waits}) w "
        "WHERE true"  # SQLite's upsert after a SELECT needs a WHERE
    )
    return sql.replace("%", "%%") if postgres else sql  # psycopg: % is its placeholder's


_COUNT = {postgres: _count_sql(postgres) for postgres in (False, True)}


def insert_points(
    writer: BulkCursor, table: Table, columns: Sequence[str], rows: list[tuple]
) -> int:
    """Inserts timeline points (tuples in `columns` order, their request's number among them:
    request_numbers) and counts the KV waits they change; returns the points stored (a
    retry's, already stored, not counted)."""
    engine_at, number_at, point_at = (
        columns.index(c) for c in ("engine_id", "request_no", "point")
    )
    engines = {
        row[number_at]: row[engine_at] or ""
        for row in rows
        if row[number_at] is not None and row[point_at] in KINDS
    }
    before = firsts(writer, engines) if engines else {}
    stored = writer.insert(table, columns, rows)
    if stored and engines:
        _count(writer, engines, before, firsts(writer, engines))
    return stored


def firsts(writer: BulkCursor, numbers: Iterable[int]) -> dict[int, Firsts]:
    """The first allocation and first load stored of each request, by its number (requests
    with neither left out)."""
    wanted = sorted(set(numbers))
    found = writer.execute(
        _BY_REQUEST[writer.postgres], (wanted if writer.postgres else json.dumps(wanted),)
    )
    return {number: (allocated, loaded) for number, allocated, loaded in found}


def _count(
    writer: BulkCursor,
    engines: dict[int, str],
    before: dict[int, Firsts],
    after: dict[int, Firsts],
) -> None:
    changes: Counter[tuple[int, int, str]] = Counter()
    for number, now in after.items():
        was = before.get(number, (None, None))
        if now == was:
            continue
        engine = engines[number]
        for (allocated, loaded), sign in ((was, -1), (now, 1)):
            if allocated is not None and loaded is not None:
                changes[(allocated, loaded, engine)] += sign
    # In the order of their counter rows (second, engine, bin), as every writer takes them.
    order = sorted(changes, key=lambda w: (w[0] - w[0] % RESOLUTION_NS, w[2], w[1] - w[0]))
    rows = [(*wait, changes[wait]) for wait in order if changes[wait]]
    if rows:
        writer.executemany(_COUNT[writer.postgres], rows)


FORMER_TRIGGER = "kvscope_rollup_kv_wait"
"""The row trigger on timelinepoint that counted KV waits up to schema 9."""


def drop_trigger(connection: Connection) -> None:
    """Drops the former trigger (and its PostgreSQL function), if there."""
    if connection.dialect.name == "postgresql":
        connection.exec_driver_sql(f"DROP TRIGGER IF EXISTS {FORMER_TRIGGER} ON timelinepoint")
        connection.exec_driver_sql(f"DROP FUNCTION IF EXISTS {FORMER_TRIGGER}()")
    else:
        connection.exec_driver_sql(f"DROP TRIGGER IF EXISTS {FORMER_TRIGGER}")


def migrate(connection: Connection) -> None:
    """Migration 10: the trigger dropped, as the writer counts the waits. The counts it kept
    stay: the writer goes on from the same per-request state."""
    drop_trigger(connection)
