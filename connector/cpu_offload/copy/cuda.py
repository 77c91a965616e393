"""CUDA copy backend: a load stream and a store stream at the lowest priority, polled events."""

import contextlib
import logging
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from kvscope.connector.cpu_offload.copy.engine import (
    CopyEngine,
    CopyJob,
    CopyResult,
    Direction,
    InjectedFault,
    describe_error,
)
from kvscope.connector.cpu_offload.copy.host_buffer import HostBuffer
from kvscope.connector.cpu_offload.copy.staging import (
    STAGING_BYTES,
    Staging,
    staged_load,
    staged_store,
)

logger = logging.getLogger(__name__)


class StreamOps(Protocol):
    """The stream and event calls the engine makes: torch.cuda's, or fakes in CPU tests.

    Streams need wait_stream, wait_event and synchronize; events record(stream), query,
    synchronize and elapsed_time (ms), as torch.cuda's do.
    """

    def new_stream(self) -> Any:
        """A stream at the lowest priority the device has."""

    def current_stream(self) -> Any: ...

    def new_event(self) -> Any: ...

    def use_stream(self, stream: Any) -> contextlib.AbstractContextManager: ...


class CudaStreamOps:
    """StreamOps on one CUDA device."""

    def __init__(self, device: torch.device):
        self.device = device

    def new_stream(self) -> torch.cuda.Stream:
        # (least, greatest): a larger number is a lower priority. KV copies yield to the
        # forward, as vLLM's own offloader's do: a load's scatter kernels must not run ahead
        # of decode kernels (time per output token), and a step that needs the load waits
        # for it on its own event anyway.
        lowest, _ = torch.cuda.Stream.priority_range()
        return torch.cuda.Stream(self.device, priority=lowest)

    def current_stream(self) -> torch.cuda.Stream:
        return torch.cuda.current_stream(self.device)

    def new_event(self) -> torch.cuda.Event:
        return torch.cuda.Event(enable_timing=True)

    def use_stream(self, stream: torch.cuda.Stream) -> contextlib.AbstractContextManager:
        return torch.cuda.stream(stream)


@dataclass
class _InFlight:
    job: CopyJob
    started: Any
    finished: Any
    error: str | None
    num_copies: int = 0
    cancelled: bool = False


@dataclass
class _Lane:
    """One copy stream, the device memory it reuses, and its jobs in submission order."""

    stream: Any
    staging: Staging
    in_flight: deque[_InFlight]


class CudaCopyEngine(CopyEngine):
    """Loads on one stream, stores on another, each in order, both at the lowest priority.

    Both start after the work already queued on the compute stream: a store must see the KV
    the forward wrote, a load must not race a write (or zeroing) of its destination blocks.
    A store also waits for the loads submitted before it, which may read its host blocks;
    a load never waits for stores, so a resuming request is not held behind offloading.

    Nothing here waits on the GPU from the host except wait() and shutdown(), which callers use only
    when they must (a preemption, the end). The stream and event calls go through StreamOps, so CPU
    tests can drive the same logic with fakes.
    """

    def __init__(
        self,
        kv_layers: Sequence[torch.Tensor],
        host_buffer: HostBuffer,
        block_dim: int,
        ops: StreamOps | None = None,
        staging_bytes: int = STAGING_BYTES,
    ):
        super().__init__(kv_layers, host_buffer, block_dim)
        if not host_buffer.pinned:
            logger.warning("host buffer is not pinned: CUDA copies will block the caller")
        self.device: torch.device = kv_layers[0].device
        self.ops: StreamOps = ops or CudaStreamOps(self.device)
        self.lanes: dict[Direction, _Lane] = {
            direction: _Lane(
                self.ops.new_stream(),
                Staging.allocate(
                    self.host_tables[0], self.layout.num_device_blocks, self.device, staging_bytes
                ),
                deque(),
            )
            for direction in (Direction.LOAD, Direction.STORE)
        }
        self._spare_events: list[Any] = []

    def poll(self) -> list[CopyResult]:
        now = time.monotonic()
        return [result for lane in self.lanes.values() for result in self._take_done(lane, now)]

    def wait(self, job_id: int, timeout_s: float | None = None) -> bool:
        entry = self._find(job_id)
        if entry is None:
            return True
        if timeout_s is None:
            entry.finished.synchronize()
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not self._is_done(entry, time.monotonic()):
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(0.0002)
        return True

    def cancel(self, job_id: int) -> bool:
        """Queued copies cannot be withdrawn from a stream: the job is failed now, and its
        blocks are free only once its finished event says the copy ended."""
        entry = self._find(job_id)
        if entry is None:
            return False
        entry.cancelled = True
        return bool(entry.finished.query())

    @property
    def num_pending(self) -> int:
        return sum(len(lane.in_flight) for lane in self.lanes.values())

    def make_compute_stream_wait(self, job_id: int) -> None:
        """Orders the caller's current stream after a job without blocking the host."""
        entry = self._find(job_id)
        if entry is not None:
            self.ops.current_stream().wait_event(entry.finished)

    def shutdown(self, timeout_s: float | None = None) -> None:
        """Waits for both streams; timeout_s is not enforceable on a CUDA stream."""
        super().shutdown(timeout_s)
        for lane in self.lanes.values():
            lane.stream.synchronize()

    def _start(self, job: CopyJob) -> None:
        lane = self.lanes[job.direction]
        started, finished = self._event(), self._event()
        lane.stream.wait_stream(self.ops.current_stream())
        loads = self.lanes[Direction.LOAD].in_flight
        if job.direction is Direction.STORE and loads:
            lane.stream.wait_event(loads[-1].finished)  # the load stream runs in order
        with self.ops.use_stream(lane.stream):
            started.record(lane.stream)
            error, num_copies = self._enqueue_copies(job, lane.staging)
            finished.record(lane.stream)
        lane.in_flight.append(_InFlight(job, started, finished, error, num_copies))

    def _enqueue_copies(self, job: CopyJob, staging: Staging) -> tuple[str | None, int]:
        copy = staged_store if job.direction is Direction.STORE else staged_load
        try:
            if job.fail_reason is not None:
                raise InjectedFault(job.fail_reason)
            tables = (self.device_tables, self.host_tables, self.table_block_dim)
            return None, copy(*tables, job.runs, staging)
        except Exception as exc:  # reported through poll(), like an asynchronous failure
            return describe_error(exc), 0

    def _take_done(self, lane: _Lane, now: float) -> list[CopyResult]:
        done: list[CopyResult] = []
        kept: deque[_InFlight] = deque()
        copied = True
        for entry in lane.in_flight:
            # A stream runs in order: past the first unfinished event none is finished.
            copied = copied and bool(entry.finished.query())
            if copied and (entry.cancelled or now >= entry.job.not_before):
                done.append(self._result(entry))
            else:
                kept.append(entry)
        lane.in_flight = kept
        return done

    def _find(self, job_id: int) -> _InFlight | None:
        for lane in self.lanes.values():
            for entry in lane.in_flight:
                if entry.job.job_id == job_id:
                    return entry
        return None

    def _event(self) -> Any:
        return self._spare_events.pop() if self._spare_events else self.ops.new_event()

    @staticmethod
    def _is_done(entry: _InFlight, now: float) -> bool:
        return (entry.cancelled or now >= entry.job.not_before) and bool(entry.finished.query())

    def _result(self, entry: _InFlight) -> CopyResult:
        duration_s = entry.started.elapsed_time(entry.finished) / 1000.0
        self._spare_events += [entry.started, entry.finished]
        error = "cancelled" if entry.cancelled else entry.error
        return entry.job.result(duration_s, error, entry.num_copies)
