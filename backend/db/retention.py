"""Keeps the database bounded: drops spans beyond the count or age limit, and what they fed.

Every statement is a bounded range on an index (span ids are given in arrival order, so the
newest max_spans are the ids above max(id) - max_spans): no count, no OFFSET, no scan. A pass
is a series of steps of at most `batch` rows per table, each in its own short transaction,
so the writer lock is never held for long.
"""

from sqlalchemy import Connection, text

from kvscope.backend.db import request_numbers, span_counts
from kvscope.backend.db.rollups import RESOLUTION_NS

MAX_AGE_S = 1e11
"""Longer than anything a signed 64-bit nanosecond time can hold back from now."""

BATCH = 20_000
"""Rows per table per step: a step stays in the tens of milliseconds on SQLite."""

# Two statements: SQLite answers MIN or MAX alone from the key's ends, both at once by a scan.
_LOWEST_SPAN_ID = text("SELECT MIN(id) FROM span")
_HIGHEST_SPAN_ID = text("SELECT MAX(id) FROM span")
# Each returns the deleted spans' start times: they leave the per-second span counts too.
_SPANS_UP_TO = text("DELETE FROM span WHERE id <= :upto RETURNING start_ns")
_SPANS_BEFORE = text(
    "DELETE FROM span WHERE id IN "
    "(SELECT id FROM span WHERE start_ns < :before ORDER BY start_ns LIMIT :batch) "
    "RETURNING start_ns"
)
_OLDEST_SPAN = text("SELECT MIN(start_ns) FROM span")

# (table, condition): rows derived from spans that are gone; current block and lease state
# stays. Each condition is a range on that table's time index.
_DERIVED = (
    ("timelinepoint", "time_ns < :before"),
    ("transfer", "start_ns < :before"),
    ("failure", "time_ns < :before"),
    ("lookup", "time_ns < :before"),
    ("latency", "time_ns < :before"),
    ("kv_request", "end_ns IS NOT NULL AND end_ns < :before"),
    ("lease", "ended_ns IS NOT NULL AND ended_ns < :before"),
    ("block", "state = 'evicted' AND updated_ns < :before"),
    # A second's rollup goes once all of it is older: the span counts of the second that
    # holds the oldest span kept are still read.
    ("series_rollup", f"bucket_ns < :before - {RESOLUTION_NS}"),
)
_DERIVED_DELETES = tuple(
    text(f"DELETE FROM {table} WHERE id IN (SELECT id FROM {table} WHERE {where} LIMIT :batch)")
    for table, where in _DERIVED
)


def cutoff_ns(max_age_s: float, now_ns: int) -> int:
    # Clamped to what a 64-bit column can compare with (an age may be set to 'inf').
    return max(0, now_ns - int(min(max_age_s, MAX_AGE_S) * 1e9))


def prune_step(
    connection: Connection, max_spans: int, max_age_s: float, now_ns: int, batch: int = BATCH
) -> tuple[int, bool]:
    """One bounded step: (spans removed, whether more is left to remove)."""
    before = cutoff_ns(max_age_s, now_ns)
    starts = _deleted(connection, _SPANS_BEFORE, {"before": before, "batch": batch})
    more = len(starts) >= batch
    low = connection.execute(_LOWEST_SPAN_ID).scalar()
    high = connection.execute(_HIGHEST_SPAN_ID).scalar()
    if low is not None and high is not None and high - low + 1 > max_spans:
        upto = min(high - max_spans, low + batch - 1)
        starts += _deleted(connection, _SPANS_UP_TO, {"upto": upto})
        more = more or upto < high - max_spans
    span_counts.remove(connection, starts)
    removed = len(starts)
    oldest = connection.execute(_OLDEST_SPAN).scalar()
    derived_before = max(before, oldest if oldest is not None else now_ns)
    # Always: a few probes of time indexes, and derived rows left by an earlier step go too.
    more = _prune_derived(connection, derived_before, batch) or more
    more = request_numbers.prune(connection, batch) or more
    return removed, more


def _deleted(connection: Connection, statement, parameters: dict) -> list[int]:
    return [start for (start,) in connection.execute(statement, parameters)]


def _prune_derived(connection: Connection, before_ns: int, batch: int) -> bool:
    """Deletes up to `batch` derived rows per table older than before_ns; True if more left."""
    more = False
    for statement in _DERIVED_DELETES:
        gone = connection.execute(statement, {"before": before_ns, "batch": batch}).rowcount
        more = more or gone >= batch
    return more


def prune(connection: Connection, max_spans: int, max_age_s: float, now_ns: int) -> int:
    """Every step in one transaction (tests, tools); the server runs steps one by one."""
    total, more = prune_step(connection, max_spans, max_age_s, now_ns)
    while more:
        removed, more = prune_step(connection, max_spans, max_age_s, now_ns)
        total += removed
    return total
