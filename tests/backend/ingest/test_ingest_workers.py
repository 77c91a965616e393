"""Ingest worker processes: batches decoded off the server's process, a killed worker replaced."""

import os
import signal
import subprocess
import sys
import time
import uuid

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace.export import SpanExportResult

from kvscope.backend.ingest.body import PROTOBUF
from kvscope.backend.ingest.bound import Limits
from kvscope.backend.ingest.prepare import from_wire, prepare, to_wire

from ..story import Process, load_story

pytestmark = pytest.mark.timeout(120)


def _story_spans(engine_id: str, count: int) -> list:
    scheduler, worker = Process("s", engine_id, "scheduler"), Process("w", engine_id, "worker")
    t0 = time.time_ns()
    for index in range(count):
        load_story(scheduler, worker, None, f"req-{index}-{engine_id}", t0 + index * 10**8)
    return scheduler.spans() + worker.spans()


def _total(backend, engine_id: str) -> int:
    with backend.client() as client:
        page = client.get("/api/v1/requests", params={"engine_id": engine_id, "limit": 1})
        return page.json()["total"]


def _worker_pids(backend) -> list[int]:
    executor = backend.app.state.ingest.pool._executor
    return [process.pid for process in executor._processes.values()]


def test_batches_are_decoded_by_worker_processes(backend):
    engine_id = f"engine-{uuid.uuid4().hex[:6]}"
    assert backend.export(_story_spans(engine_id, 3)) == SpanExportResult.SUCCESS
    assert _total(backend, engine_id) == 3
    pids = _worker_pids(backend)
    assert len(pids) == 2 and os.getpid() not in pids


def test_a_killed_worker_is_replaced_and_the_batch_retried(backend):
    engine_id = f"engine-{uuid.uuid4().hex[:6]}"
    assert backend.export(_story_spans(engine_id, 1)) == SpanExportResult.SUCCESS
    for pid in _worker_pids(backend):
        os.kill(pid, signal.SIGKILL)
    time.sleep(0.5)
    # The first attempt may find the pool broken (503, Retry-After): the exporter retries.
    more = f"engine-{uuid.uuid4().hex[:6]}"
    assert backend.export(_story_spans(more, 2)) == SpanExportResult.SUCCESS
    assert _total(backend, more) == 2
    assert _total(backend, engine_id) == 1
    with backend.client() as client:
        assert client.get("/health").json()["status"] == "ok"


def test_a_body_a_worker_cannot_read_is_refused_with_its_reason(backend):
    with backend.client() as client:
        answer = client.post(
            "/v1/traces", content=b"\x0a\xff\xff", headers={"Content-Type": PROTOBUF}
        )
    assert answer.status_code == 400
    assert "not a valid OTLP protobuf message" in answer.text
    assert len(_worker_pids(backend)) == 2  # a bad body is the sender's fault, not the worker's


_ORPHAN = """
import os, signal, time
from kvscope.backend.ingest.bound import Limits
from kvscope.backend.ingest.workers import IngestPool
pool = IngestPool(Limits(), 2)
pool.warm_up()
while not pool.ready:
    time.sleep(0.05)
print(*(process.pid for process in pool._executor._processes.values()), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_the_workers_of_a_killed_server_exit():
    server = subprocess.run(
        [sys.executable, "-c", _ORPHAN], capture_output=True, text=True, timeout=60
    )
    assert server.returncode == -signal.SIGKILL, server.stderr
    pids = [int(pid) for pid in server.stdout.split()]
    assert len(pids) == 2
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(pid) for pid in pids)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False


def test_a_prepared_batch_comes_back_from_a_worker_unchanged():
    body = encode_spans(_story_spans("engine-wire", 3)).SerializeToString()
    prepared = prepare(body, PROTOBUF, Limits())
    assert prepared.facts.spans and prepared.facts.requests and prepared.resources
    assert from_wire(to_wire(prepared)) == prepared
    empty = prepare(b"", PROTOBUF, Limits())
    assert empty.facts is None and from_wire(to_wire(empty)) == empty
