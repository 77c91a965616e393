"""SIGKILL during ingest, restart on the same SQLite file: every acknowledged batch is there.

`python -m kvscope.backend` runs as a subprocess; two senders post OTLP protobuf batches
(spans made and encoded by the OTel SDK) while the process is killed mid-stream, several
times. A 200 means committed: after each restart the database must hold every span of every
batch that got one, and SQLite's integrity check must pass.
"""

import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time

import httpx
import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

from kvscope.bench.backend.ingest_clients import MS, make_tracer, request_spans
from kvscope.harness.engine import free_port

pytestmark = pytest.mark.timeout(300)

KILLS = 3
REQUESTS_PER_BATCH = 8  # about 80 spans per batch
ACKS_BEFORE_KILL = 4  # batches acknowledged in a round before the kill can come


class Backend:
    """One `python -m kvscope.backend` process on a free port; always reaped."""

    def __init__(self, database: str, log_path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {
            **os.environ,
            "DATABASE_URL": f"sqlite:///{database}",
            "KVSCOPE_BACKEND_LOG_LEVEL": "warning",
        }
        self.log = open(log_path, "ab")  # noqa: SIM115 (closed in stop)
        command = [sys.executable, "-m", "kvscope.backend", "--port", str(self.port)]
        self.process = subprocess.Popen(command, env=env, stdout=self.log, stderr=self.log)
        deadline = time.monotonic() + 60
        while not self._healthy():
            if time.monotonic() > deadline or self.process.poll() is not None:
                self.stop()
                raise RuntimeError(f"backend did not start; see {log_path}")
            time.sleep(0.1)

    def _healthy(self) -> bool:
        try:
            return httpx.get(f"{self.url}/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()
        self.log.close()


def make_batches(count: int) -> list[tuple[bytes, set[tuple[str, str]]]]:
    """Encoded export requests, each with the (trace_id, span_id) keys it carries."""
    tracer, collector = make_tracer(f"crash-{os.getpid()}-{time.monotonic_ns()}")
    t0 = time.time_ns()
    batches = []
    for number in range(count):
        collector.spans = []
        for offset in range(REQUESTS_PER_BATCH):
            index = number * REQUESTS_PER_BATCH + offset
            request_spans(tracer, index, t0 + index * 25 * MS)
        keys = {
            (f"{s.context.trace_id:032x}", f"{s.context.span_id:016x}") for s in collector.spans
        }
        batches.append((encode_spans(collector.spans).SerializeToString(), keys))
    return batches


def send_until_refused(url: str, batches, acknowledged: list, stop: threading.Event) -> None:
    """Posts batches in turn; keeps those answered 200 until the server stops answering."""
    with httpx.Client(timeout=10) as client:
        while not stop.is_set() and batches:
            body, keys = batches.pop()
            try:
                response = client.post(
                    f"{url}/v1/traces",
                    content=body,
                    headers={"Content-Type": "application/x-protobuf"},
                )
            except httpx.HTTPError:
                return  # killed: the batch in flight was never acknowledged
            if response.status_code == 200:
                acknowledged.append(keys)


def stored_keys(database) -> set[tuple[str, str]]:
    with sqlite3.connect(database, timeout=30) as connection:
        assert connection.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        return set(connection.execute("SELECT trace_id, span_id FROM span"))


def test_every_acknowledged_batch_survives_sigkill_during_ingest(tmp_path):
    database = tmp_path / "crash.db"
    batches = make_batches(60 * KILLS)
    acknowledged: list[set] = []
    for _ in range(KILLS):
        backend = Backend(database, tmp_path / "backend.log")
        try:
            before = len(acknowledged)
            stop = threading.Event()
            senders = [
                threading.Thread(
                    target=send_until_refused, args=(backend.url, batches, acknowledged, stop)
                )
                for _ in range(2)
            ]
            for sender in senders:
                sender.start()
            deadline = time.monotonic() + 60
            while len(acknowledged) - before < ACKS_BEFORE_KILL and time.monotonic() < deadline:
                time.sleep(0.01)
            assert len(acknowledged) - before >= ACKS_BEFORE_KILL, "no batches were acknowledged"
            backend.kill()  # both senders still posting: a batch is in flight or queued
            stop.set()
            for sender in senders:
                sender.join(timeout=30)
                assert not sender.is_alive()
        finally:
            backend.stop()
        # The restarted backend opens the same file (recovering the WAL) and serves it.
        restarted = Backend(database, tmp_path / "backend.log")
        try:
            health = httpx.get(f"{restarted.url}/health", timeout=10).json()
            assert health["status"] == "ok"
        finally:
            restarted.stop()
        stored = stored_keys(database)
        lost = [keys - stored for keys in acknowledged if not keys <= stored]
        assert not lost, f"{len(lost)} acknowledged batches lost spans after SIGKILL"
    assert len(acknowledged) >= KILLS * ACKS_BEFORE_KILL
