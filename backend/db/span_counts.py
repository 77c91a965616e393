"""Spans per second in the series rollups: added by the writer, taken away by retention, and a
window's count read from them, exactly (whole seconds from the rollup, the two edges counted).

PostgreSQL counts a window of the span table by an index-only scan that still visits the heap
for every row not yet marked all-visible, and a live window's rows are the newest ones: at 5.6M
spans the summary's count took 38 ms of its 62. From the rollup it is a range of one small row
per second per backend. Spans an exporter's retry brought again (ON CONFLICT DO NOTHING) are
not counted. Each backend process keeps rows of its own (the label): backends sharing a database
never wait for each other's transactions on one counter row.
"""

import os
import socket
from collections import Counter
from collections.abc import Iterable

from sqlalchemy import Connection, text

from kvscope.backend.db.bulk import BulkCursor
from kvscope.backend.db.rollups import RESOLUTION_NS, add_sql

METRIC = "spans"
WRITER = f"{socket.gethostname()}:{os.getpid()}"
"""This process's rows (the rollup's label); a count sums every writer's."""

# A second's spans, added to this writer's counter row of that second.
_COUNT = add_sql(f"VALUES ('{METRIC}', ?, '', ?, ?, 0, 0, 0)")
# The spans one batch stored, told from those stored before by their received time.
_STORED_BY = "SELECT start_ns FROM span WHERE start_ns >= ? AND start_ns <= ? AND received_ns = ?"

ROLLED = text(
    f"SELECT COALESCE(SUM(samples), 0) FROM series_rollup WHERE metric = '{METRIC}' "
    "AND bucket_ns >= :since AND bucket_ns < :until"
)
COUNTED = text("SELECT COUNT(*) FROM span WHERE start_ns >= :since AND start_ns < :until")


def per_second(starts: Iterable[int]) -> list[tuple[int, int]]:
    """(second's start in ns, spans), ascending: concurrent writers lock rows in one order."""
    return sorted(Counter(start - start % RESOLUTION_NS for start in starts).items())


def add_stored(writer: BulkCursor, spans: list[tuple[int, int]], stored: int) -> None:
    """Counts what one insert of (start_ns, received_ns) spans stored: all of them (the usual
    case), none (a retry of a stored batch), or, when a retry overlapped, those it brought."""
    if not stored or not spans:
        return
    if stored == len(spans):
        starts = [start for start, _ in spans]
    else:
        starts = []
        for received in {received for _, received in spans}:
            mine = [start for start, at in spans if at == received]
            found = writer.execute(_STORED_BY, (min(mine), max(mine), received))
            starts.extend(start for (start,) in found)
    _add(writer, starts, 1)


def remove(connection: Connection, starts: list[int]) -> None:
    """Takes spans that retention deleted (their start times) out of the counts."""
    _add(BulkCursor(connection), starts, -1)


def _add(writer: BulkCursor, starts: list[int], sign: int) -> None:
    rows = [(second, WRITER, sign * n) for second, n in per_second(starts)]
    if rows:
        writer.executemany(_COUNT, rows)


def in_window(connection: Connection, since_ns: int, until_ns: int) -> int:
    """Spans that started in [since, until): the rollup's whole seconds, the edges counted."""
    first = since_ns + (-since_ns) % RESOLUTION_NS  # the first whole second's start
    last = until_ns - until_ns % RESOLUTION_NS  # the end of the last whole second
    if first >= last:
        return connection.execute(COUNTED, {"since": since_ns, "until": until_ns}).scalar_one()
    edges = [(since_ns, first), (last, until_ns)]
    return connection.execute(ROLLED, {"since": first, "until": last}).scalar_one() + sum(
        connection.execute(COUNTED, {"since": low, "until": high}).scalar_one()
        for low, high in edges
        if low < high
    )


def migrate(connection: Connection) -> None:
    """Migration 9: the stored spans counted into the rollup (one pass in the order of the
    span table's time key), and its narrow time index, kept only for that count, dropped."""
    second = f"(start_ns / {RESOLUTION_NS}) * {RESOLUTION_NS}"
    # Counted afresh: whatever was counted before (by a writer newer than the schema) is in.
    connection.execute(text(f"DELETE FROM series_rollup WHERE metric = '{METRIC}'"))
    connection.execute(
        text(
            add_sql(
                f"SELECT '{METRIC}', {second}, '', :writer, COUNT(*), 0, 0, 0 FROM span "
                f"WHERE true GROUP BY {second}"  # WHERE: SQLite's upsert after a SELECT
            )
        ),
        {"writer": WRITER},
    )
    connection.execute(text("DROP INDEX IF EXISTS ix_span_start_ns"))
