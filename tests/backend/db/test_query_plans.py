"""Every query the dashboard polls, and every retention step, reads an index range on SQLite:
no full scan of a table that grows with the span stream."""

import re

import pytest
from sqlalchemy import text

from kvscope.backend.db import liveness, request_numbers, retention, span_counts
from kvscope.backend.db.database import make_engine
from kvscope.backend.db.migrations import migrate
from kvscope.backend.queries import accounting, aggregates

GROWING = {
    *("span", "timelinepoint", "transfer", "failure", "lookup", "latency", "kv_request"),
    *("series_rollup", "request_number"),
}
"""Tables with a row per span or request; block and lease are bounded by pool sizes."""

WINDOWED = {
    name: getattr(aggregates, name)
    for name in (
        "LAST_LOOKUPS",
        "HITS_BY_CONNECTOR",
        "ROLLED_HITS",
        "ROLLED_BY_LABEL",
        "ROLLED_HIT_TOKENS",
        "TTFT_SAMPLES",
        "TRANSFERS_BY_DIRECTION",
        "LEASES_IN_WINDOW",
        "REQUESTS_BY_STATUS",
        "LEASES_HELD",
    )
}
WINDOWED["SPANS_ROLLED"] = span_counts.ROLLED
WINDOWED["SPANS_COUNTED"] = span_counts.COUNTED
RETENTION = {
    "spans_before": retention._SPANS_BEFORE,
    "spans_up_to": retention._SPANS_UP_TO,
    "lowest_span_id": retention._LOWEST_SPAN_ID,
    "highest_span_id": retention._HIGHEST_SPAN_ID,
    "oldest_span": retention._OLDEST_SPAN,
    **{f"derived_{i}": s for i, s in enumerate(retention._DERIVED_DELETES)},
    **{f"lowest_number_{i}": s for i, s in enumerate(request_numbers._LOWEST_NUMBERS)},
    "numbers_below": request_numbers._NUMBERS_BELOW,
    "close_leases": liveness._CLOSE_LEASES,
    "close_requests": liveness._CLOSE_REQUESTS,
}
PARAMETERS = {
    "since": 1,
    "until": 2,
    "step": 1,
    "before": 1,
    "upto": 1,
    "batch": 10,
    "ended_ns": 1,
    "outcome": "x",
    "message": "x",
    "instance_id": "p",
    "cutoff": 1,
    "metric": "hit",
    "below": 1,
}


@pytest.fixture(scope="module")
def connection(tmp_path_factory):
    engine = make_engine(f"sqlite:///{tmp_path_factory.mktemp('plans')}/plans.db")
    migrate(engine)
    with engine.connect() as connection:
        yield connection
    engine.dispose()


def _full_scans(connection, statement) -> list[str]:
    plan = connection.execute(text(f"EXPLAIN QUERY PLAN {statement.text}"), PARAMETERS).all()
    details = [row[-1] for row in plan]
    scans = []
    for detail in details:
        found = re.match(r"SCAN (\w+)", detail)
        if found and found.group(1) in GROWING:  # SEARCH (a range) is fine, SCAN is not
            scans.append(detail)
    return scans


@pytest.mark.parametrize("name", sorted(WINDOWED) + sorted(RETENTION))
def test_the_statement_reads_an_index_range(connection, name):
    statement = WINDOWED[name] if name in WINDOWED else RETENTION[name]
    assert _full_scans(connection, statement) == []


def test_cached_token_points_are_read_by_their_partial_index(connection):
    query = accounting.cached_tokens_query(1, 2)
    sql = query.compile(connection, compile_kwargs={"literal_binds": True})
    plan = [row[-1] for row in connection.execute(text(f"EXPLAIN QUERY PLAN {sql}"))]
    assert any("USING INDEX ix_point_cached_time" in detail for detail in plan), plan
