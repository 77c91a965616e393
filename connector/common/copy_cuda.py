"""CUDA copy backend: a dedicated stream, pinned host memory, events polled with query()."""

import logging
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from kvscope.connector.common.block_copy import CopyRun, load_runs, store_runs
from kvscope.connector.common.copy_engine import (
    CopyEngine,
    CopyJob,
    CopyResult,
    Direction,
    describe_error,
)
from kvscope.connector.common.host_buffer import HostBuffer

logger = logging.getLogger(__name__)


@dataclass
class _InFlight:
    job: CopyJob
    started: torch.cuda.Event
    finished: torch.cuda.Event
    error: str | None


class CudaCopyEngine(CopyEngine):
    """Jobs run in order on one side stream, after the work already queued on the compute one."""

    def __init__(self, kv_layers: Sequence[torch.Tensor], host_buffer: HostBuffer, block_dim: int):
        super().__init__(kv_layers, host_buffer, block_dim)
        if not host_buffer.pinned:
            logger.warning("host buffer is not pinned: CUDA copies will block the caller")
        self.device: torch.device = kv_layers[0].device
        self.stream: torch.cuda.Stream = torch.cuda.Stream(device=self.device)
        self._in_flight: deque[_InFlight] = deque()

    def poll(self) -> list[CopyResult]:
        finished: list[CopyResult] = []
        now = time.monotonic()
        # One stream runs jobs in order: the first unfinished job hides all later ones.
        while self._in_flight and self._is_done(self._in_flight[0], now):
            finished.append(self._result(self._in_flight.popleft()))
        return finished

    def wait(self, job_id: int, timeout_s: float | None = None) -> bool:
        entry = next((e for e in self._in_flight if e.job.job_id == job_id), None)
        if entry is None:
            return True
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        if deadline is None:
            entry.finished.synchronize()
        while not self._is_done(entry, time.monotonic()):
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(0.0002)
        return True

    @property
    def num_pending(self) -> int:
        return len(self._in_flight)

    def make_compute_stream_wait(self, job_id: int) -> None:
        """Orders the caller's current stream after a job without blocking the host."""
        entry = next((e for e in self._in_flight if e.job.job_id == job_id), None)
        if entry is not None:
            torch.cuda.current_stream(self.device).wait_event(entry.finished)

    def shutdown(self, timeout_s: float | None = None) -> None:
        """Waits for the side stream; timeout_s is not enforceable on a CUDA stream."""
        super().shutdown(timeout_s)
        self.stream.synchronize()

    def _start(self, job: CopyJob) -> None:
        started = torch.cuda.Event(enable_timing=True)
        finished = torch.cuda.Event(enable_timing=True)
        error = job.fail_reason
        # Stores must see the KV the forward pass wrote; loads must not race blocks that the
        # compute stream still uses for a request that just finished.
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            started.record(self.stream)
            if error is None:
                error = self._enqueue_copies(job)
            finished.record(self.stream)
        self._in_flight.append(_InFlight(job, started, finished, error))

    def _enqueue_copies(self, job: CopyJob) -> str | None:
        try:
            # Index tensors go up on the side stream, so the compute stream is never synced.
            runs = [replace(run, device_block_ids=self._to_device(run)) for run in job.runs]
            copy = store_runs if job.direction is Direction.STORE else load_runs
            copy(self.kv_layers, self.host_buffer.layers, self.layout.block_dim, runs, True)
            return None
        except Exception as exc:  # reported through poll(), like an asynchronous failure
            return describe_error(exc)

    def _to_device(self, run: CopyRun) -> torch.Tensor:
        return run.device_block_ids.to(self.device, non_blocking=True)

    @staticmethod
    def _is_done(entry: _InFlight, now: float) -> bool:
        return now >= entry.job.not_before and entry.finished.query()

    @staticmethod
    def _result(entry: _InFlight) -> CopyResult:
        duration_s = entry.started.elapsed_time(entry.finished) / 1000.0
        return entry.job.result(duration_s, entry.error)
