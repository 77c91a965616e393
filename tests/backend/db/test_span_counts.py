"""Spans per second in the rollups: a window's count from them equals COUNT(*) over the span
table, through retries (whole and overlapping), retention by count and age, and migration 9."""

import random

import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as pb
from sqlalchemy import inspect, text

from kvscope.backend.db import retention, span_counts
from kvscope.backend.db.bulk import add_postgres_stages
from kvscope.backend.db.database import make_engine
from kvscope.backend.db.migrations import VERSION_TABLE, latest_version, migrate
from kvscope.backend.ingest.pipeline import Pipeline
from kvscope.backend.ingest.write import STAGED_TABLES
from kvscope.backend.live import Hub
from kvscope.backend.settings import Settings
from kvscope.bench.backend.scale_spans import Batches

pytestmark = pytest.mark.timeout(120)

PROTOBUF = "application/x-protobuf"
SECOND = 10**9


def _counted(connection, since: int, until: int) -> int:
    return connection.execute(span_counts.COUNTED, {"since": since, "until": until}).scalar()


def _windows(low: int, high: int, rng: random.Random) -> list[tuple[int, int]]:
    """Windows across the stored times: unaligned, sub-second, empty, and the whole range."""
    found = [(low - SECOND, high + SECOND), (low, low + SECOND // 3), (high + 5, high + 9)]
    for _ in range(30):
        since = rng.randrange(low - SECOND, high)
        found.append((since, since + rng.randrange(1, 4 * SECOND)))
    return found


def _assert_counts_agree(engine, rng: random.Random) -> int:
    with engine.connect() as connection:
        low, high = connection.execute(text("SELECT MIN(start_ns), MAX(start_ns) FROM span")).one()
        for since, until in _windows(low, high, rng):
            counted = _counted(connection, since, until)
            assert span_counts.in_window(connection, since, until) == counted, (since, until)
        return _counted(connection, low, high + 1)


def _merged(*bodies: bytes) -> bytes:
    """One export request holding every span of the given ones."""
    merged = pb.ExportTraceServiceRequest()
    for body in bodies:
        merged.MergeFromString(body)
    return merged.SerializeToString()


@pytest.fixture
def pipeline(database_url):
    settings = Settings(database_url=database_url, ingest_workers=0)
    engine = make_engine(database_url)
    add_postgres_stages(engine, STAGED_TABLES)  # as the app does
    migrate(engine)
    service = Pipeline(engine, settings, Hub())
    yield service
    service.close()
    engine.dispose()


def test_counts_follow_retries_and_retention(pipeline):
    batches = Batches(6 * 520)
    bodies = [batches.body(index) for index in range(batches.count)]
    rng = random.Random(7)
    for body in bodies[:4]:
        pipeline.ingest(body, PROTOBUF)
    total = _assert_counts_agree(pipeline.engine, rng)
    assert pipeline.ingest(bodies[0], PROTOBUF).new_spans == 0  # a whole retry
    overlapping = pipeline.ingest(_merged(bodies[1], bodies[4]), PROTOBUF)
    assert overlapping.new_spans == batches.spans  # body 1 was stored before, body 4 was not
    last = pipeline.ingest(bodies[5], PROTOBUF).new_spans
    assert _assert_counts_agree(pipeline.engine, rng) == total + overlapping.new_spans + last

    with pipeline.engine.begin() as connection:  # by count, in small steps, then by age
        newest = connection.execute(text("SELECT MAX(id) FROM span")).scalar()
        more = True
        while more:
            _, more = retention.prune_step(connection, 1500, 1e9, batches.end_ns, batch=333)
        middle = connection.execute(text("SELECT MIN(start_ns) FROM span")).scalar()
        age_s = (batches.end_ns - middle) / 1e9 - 1.5
        retention.prune(connection, 10**9, age_s, batches.end_ns)
        assert connection.execute(text("SELECT MAX(id) FROM span")).scalar() == newest
    assert 0 < _assert_counts_agree(pipeline.engine, rng) < 1500


def test_migration_9_counts_the_stored_spans_and_drops_the_narrow_index(database_url):
    engine = make_engine(database_url)
    add_postgres_stages(engine, STAGED_TABLES)  # as the app does
    migrate(engine)
    batches = Batches(3 * 520)
    pipeline = Pipeline(engine, Settings(database_url=database_url, ingest_workers=0), Hub())
    try:
        for index in range(batches.count):
            pipeline.ingest(batches.body(index), PROTOBUF)
    finally:
        pipeline.close()
    with engine.begin() as connection:  # as version 8 left it: no counts, the narrow index
        connection.execute(text("DELETE FROM series_rollup WHERE metric = 'spans'"))
        connection.execute(text("CREATE INDEX ix_span_start_ns ON span (start_ns)"))
        connection.execute(text(f"UPDATE {VERSION_TABLE} SET version = 8"))
    assert migrate(engine) == latest_version()  # 9 and every later migration ran
    indexes = {index["name"] for index in inspect(engine).get_indexes("span")}
    assert "ix_span_start_ns" not in indexes and "uq_span_time" in indexes
    assert _assert_counts_agree(engine, random.Random(9)) > 0
    engine.dispose()
