"""BulkCursor.insert: every row stored whatever the batch's size, NULLs as NULL, retries skipped."""

import sqlite3

import pytest
from sqlalchemy import text

from kvscope.backend.db.bulk import SQLITE_ROWS_PER_STATEMENT, BulkCursor
from kvscope.backend.db.database import make_engine
from kvscope.backend.db.models import TimelinePoint
from kvscope.backend.ingest.request_rows import POINT_COLUMNS
from tests.backend.db.conftest import T0

pytestmark = pytest.mark.timeout(60)


def _points(first: int, count: int) -> list[tuple]:
    """Points in POINT_COLUMNS order; every other one without a request, value or layer."""
    rows = []
    for n in range(first, first + count):
        bare = n % 2 == 0
        row = {
            "trace_id": f"{n:032x}",
            "span_id": f"{n:016x}",
            "ordinal": 0,
            "engine_id": None if bare else "e0",
            "request_id": None if bare else f"req-{n}",
            "point": "lookup_result",
            "time_ns": T0 + n,
            "value": None if bare else n,
            "layer": None if bare else n % 3,
        }
        rows.append(tuple(row[column] for column in POINT_COLUMNS))
    return rows


def _stored(engine) -> list[tuple]:
    columns = ", ".join(POINT_COLUMNS)
    with engine.connect() as connection:
        return [
            tuple(row)
            for row in connection.execute(text(f"SELECT {columns} FROM timelinepoint ORDER BY id"))
        ]


@pytest.mark.parametrize("count", [1, 2, 31, SQLITE_ROWS_PER_STATEMENT, 33, 51, 95])
def test_every_row_of_any_count_is_stored_once_with_its_nulls(engine, count):
    # 51: a 512-span batch's request, lookup and transfer rows, 32 and then 16 + 2 + 1.
    rows = _points(0, count)
    with engine.begin() as connection:
        assert BulkCursor(connection).insert(TimelinePoint.__table__, POINT_COLUMNS, rows) == count
    assert _stored(engine) == rows


def test_a_retry_stores_only_the_rows_it_brings_new(engine):
    with engine.begin() as connection:
        BulkCursor(connection).insert(TimelinePoint.__table__, POINT_COLUMNS, _points(0, 32))
    retried = _points(0, 51)  # the 32 stored, then 19 new
    with engine.begin() as connection:
        assert BulkCursor(connection).insert(TimelinePoint.__table__, POINT_COLUMNS, retried) == 19
    assert _stored(engine) == retried


def test_sqlite_finds_an_adapter_for_none_that_binds_null(tmp_path):
    make_engine(f"sqlite:///{tmp_path}/kvscope.db").dispose()
    assert (type(None), sqlite3.PrepareProtocol) in sqlite3.adapters
    connection = sqlite3.connect(":memory:")
    assert connection.execute("SELECT typeof(?), ? IS NULL", (None, None)).fetchone() == (
        "null",
        1,
    )
