"""Runs one cell and records everything the checks need, before the next cell can blur it."""

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

from kvscope.harness.backend_process import BackendProcess
from tests.reliability.cases import Case
from tests.reliability.checks import CellRun, wait_for_backend
from tests.reliability.engine_ops import Batch, settle
from tests.reliability.leaks import engine_leaks
from tests.reliability.prefill_peer import PrefillPeer

PEER_LEASE_S = 5.0
"""The prefill side's lease: a reader that never comes frees its blocks after this (the
lease_expires, peer_hangs and peer_killed cells wait it out, so it is short)."""

PREEMPTED_LEASE_S = 10.0
"""The lease of the preempted cells' prefills: their requests wait for the decode side's 24 KV
blocks before they read (at 5 s a full run on this 2-core machine saw leases expire there)."""

EXPORT_TIMEOUT_S = 15.0
"""How long this process's exporter to the backend retries a batch before it counts it lost.
At 5 s a busy backend (a preempted cell's engine and both prefill peers exporting on two cores)
answered one batch too late and a healthy cell counted a lost span; a backend that is down fails
each batch after 7.5 s of refused retries."""

BACKEND_DOWN_EXPORT_TIMEOUT_S = 1.0
"""The exporter's retry time while the backend_down cells hold the backend down: each batch is
refused twice (0.5 s apart) and counted lost, instead of after 7.5 s of refused retries."""


@dataclass
class Recorder:
    """Where a cell's evidence comes from: the backend and this process's span stream."""

    backend: BackendProcess
    origin: str  # this process's kvscope.seq.origin, naming its stream on the backend
    processor: Any  # the bounded queue of this process's exporter to the backend

    @contextlib.contextmanager
    def export_queue_limited(self, size: int) -> Iterator[None]:
        """Shrinks the backend exporter's queue bound (read on every span) for a while:
        the queue_full cells overflow it without thousands of spans."""
        saved, self.processor._max_queue_size = self.processor._max_queue_size, size
        try:
            yield
        finally:
            self.processor._max_queue_size = saved

    @contextlib.contextmanager
    def export_timeout_limited(self, seconds: float) -> Iterator[None]:
        """Shortens the backend exporter's retry time (read on every export) for a while."""
        exporter = self.processor.exporter
        saved, exporter._timeout_s = exporter._timeout_s, seconds
        try:
            yield
        finally:
            exporter._timeout_s = saved

    def record(
        self, case: Case, llm: Any, body: Callable[[], Batch], peer: PrefillPeer | None = None
    ) -> CellRun:
        from kvscope.traces.sdk.configure import export_counters, flush

        before = asdict(export_counters())
        run = CellRun(case, Batch(), time.time_ns())
        run.batch = body()
        settle(llm)
        run.leaks = engine_leaks(llm)
        if peer is not None and peer.alive:
            try:
                peer.wait_until_nothing_held(PEER_LEASE_S + 10)
            except AssertionError as exc:
                run.leaks.append(str(exc))
        flush()
        run.end_ns = time.time_ns()
        after = asdict(export_counters())
        run.dropped = {key: after[key] - before[key] for key in after if key.startswith("dropped")}
        wait_for_backend(self.backend, run)
        flush()  # a fresh telemetry span: the drop count the backend shows is the latest
        run.stream = _wait_for_stream(self.backend, self.origin, after)
        return run


def _wait_for_stream(backend: BackendProcess, origin: str, counters: dict) -> dict | None:
    """This process's stream once the backend has heard of every drop counted so far."""
    dropped = counters.get("dropped_queue_full", 0) + counters.get("dropped_export_failed", 0)
    deadline = time.monotonic() + 10
    while True:
        stream = backend.stream(origin)
        reported = (stream or {}).get("telemetry_dropped") or 0
        if reported >= dropped or time.monotonic() > deadline:
            return stream
        time.sleep(0.3)


def cell_run(runs: dict, case: Case, make: Callable[[], CellRun]) -> CellRun:
    """Each cell runs once per session; its checks share the record (or its error)."""
    if case.id not in runs:
        try:
            runs[case.id] = make()
        except Exception as exc:  # every check of the cell reports the same error
            runs[case.id] = exc
    if isinstance(runs[case.id], Exception):
        raise runs[case.id]
    return runs[case.id]
