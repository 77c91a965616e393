"""Timeline points are indexed by time only where a query reads them so: vLLM's cached-token
counts, by a partial index that migration 11 brings to an older database (SQLite, and
PostgreSQL with KVSCOPE_TEST_POSTGRES_URL)."""

import pytest
from sqlalchemy import inspect, text

from kvscope.backend.db.bulk import BulkCursor
from kvscope.backend.db.database import make_engine
from kvscope.backend.db.migrations import VERSION_TABLE, latest_version, migrate
from kvscope.backend.db.models import TimelinePoint
from kvscope.backend.ingest.request_rows import POINT_COLUMNS
from kvscope.backend.queries import accounting

pytestmark = pytest.mark.timeout(60)

T0 = 1_800_000_000 * 10**9


def _indexes(engine) -> set[str]:
    return {index["name"] for index in inspect(engine).get_indexes("timelinepoint")}


def test_migration_11_indexes_only_the_cached_token_points_by_time(database_url):
    engine = make_engine(database_url)
    migrate(engine)
    with engine.begin() as connection:  # as version 10 left it: every point by kind and time
        connection.execute(text("DROP INDEX ix_point_cached_time"))
        connection.execute(
            text("CREATE INDEX ix_point_kind_time ON timelinepoint (point, time_ns)")
        )
        connection.execute(text(f"UPDATE {VERSION_TABLE} SET version = 10"))
    assert "ix_point_kind_time" in _indexes(engine)
    assert migrate(engine) == latest_version()  # 11 and every later migration ran
    assert "ix_point_kind_time" not in _indexes(engine)
    assert "ix_point_cached_time" in _indexes(engine)

    kinds = ["vllm_local_cached", "blocks_allocated", "vllm_external_cached", "finished"]
    rows = [
        ("ab" * 16, f"{n:016x}", 0, "e1", "r1", kind, T0 + n, n, None)
        for n, kind in enumerate(kinds)
    ]
    with engine.begin() as connection:
        BulkCursor(connection).insert(TimelinePoint.__table__, POINT_COLUMNS, rows)
    with engine.connect() as connection:
        found = connection.execute(accounting.cached_tokens_query(T0, T0 + 10)).all()
    engine.dispose()
    assert [(row.point, row.value) for row in found] == [
        ("vllm_external_cached", 2),
        ("vllm_local_cached", 0),
    ]
