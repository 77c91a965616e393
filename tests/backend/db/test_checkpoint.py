"""The WAL checkpointer: commits leave the WAL alone; the thread folds it in and truncates it."""

import os
import time
import uuid

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from sqlalchemy import func, select

from kvscope.backend.db.checkpoint import Checkpointer
from kvscope.backend.db.models import Span
from kvscope.backend.ingest.body import PROTOBUF
from kvscope.backend.main import create_app
from kvscope.backend.settings import Settings

from ..story import Process, load_story


def _bodies(count: int) -> list[bytes]:
    engine_id = f"engine-{uuid.uuid4().hex[:6]}"
    scheduler, worker = Process("s", engine_id, "scheduler"), Process("w", engine_id, "worker")
    t0 = time.time_ns()
    for index in range(count):
        load_story(scheduler, worker, None, f"req-{index}", t0 + index * 10**8)
    spans = scheduler.spans() + worker.spans()
    return [
        encode_spans(spans[at : at + 64]).SerializeToString() for at in range(0, len(spans), 64)
    ]


def test_commits_grow_the_wal_and_the_checkpointer_truncates_it(tmp_path):
    path = tmp_path / "kvscope.db"
    app = create_app(Settings(database_url=f"sqlite:///{path}", ingest_workers=0))
    ingest = app.state.ingest
    ingest.checkpointer.stop()  # driven by hand below
    for body in _bodies(40):
        assert ingest.ingest(body, PROTOBUF).spans
    wal = path.with_name(path.name + "-wal")
    assert os.path.getsize(wal) > 64 * 1024  # no commit copied the WAL into the database
    checkpointer = Checkpointer(ingest.engine, ingest.writer.lock, wal_limit_bytes=64 * 1024)
    checkpointer.run_once()
    assert checkpointer.truncations == 1 and os.path.getsize(wal) == 0
    with ingest.engine.connect() as connection:
        assert connection.execute(select(func.count()).select_from(Span)).scalar() > 400
        assert connection.exec_driver_sql("PRAGMA integrity_check").scalar() == "ok"
        assert connection.exec_driver_sql("PRAGMA page_size").scalar() == 2048
    ingest.close()
