"""Retention in bounded steps: each step removes at most a batch, and the steps together keep
exactly the newest spans and what they fed."""

import time
import uuid

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from sqlalchemy import text

from kvscope.backend.db import retention
from kvscope.backend.db.database import make_engine
from kvscope.backend.db.migrations import migrate
from kvscope.backend.ingest.pipeline import Pipeline
from kvscope.backend.live import Hub
from kvscope.backend.settings import Settings

from ..story import Process, load_story

pytestmark = pytest.mark.timeout(60)


def _count(connection, table: str) -> int:
    return connection.execute(text(f"SELECT COUNT(*) FROM {table}")).scalar()


def test_steps_of_a_batch_keep_the_newest_spans(tmp_path):
    settings = Settings(database_url=f"sqlite:///{tmp_path}/steps.db", ingest_workers=0)
    service = Pipeline(_engine(settings), settings, Hub())
    try:
        engine_id = f"engine-{uuid.uuid4().hex[:6]}"
        scheduler, worker = Process("s", engine_id, "scheduler"), Process("w", engine_id, "worker")
        t0 = time.time_ns()
        for index in range(6):
            load_story(scheduler, worker, None, f"r-{index}", t0 + index * 10**8, lease_id=index)
        spans = scheduler.spans() + worker.spans()
        body = encode_spans(spans).SerializeToString()
        service.ingest(body, "application/x-protobuf")
        with service.engine.begin() as connection:
            assert _count(connection, "span") == len(spans) > 50
            steps = []
            more = True
            while more:
                removed, more = retention.prune_step(connection, 50, 1e9, time.time_ns(), batch=7)
                steps.append(removed)
            assert max(steps) <= 7 and sum(steps) == len(spans) - 50
            assert _count(connection, "span") == 50
            newest = connection.execute(text("SELECT MAX(id) FROM span")).scalar()
            assert connection.execute(text("SELECT MIN(id) FROM span")).scalar() == newest - 49
    finally:
        service.close()


def _engine(settings: Settings):
    engine = make_engine(settings.database_url)
    migrate(engine)
    return engine
