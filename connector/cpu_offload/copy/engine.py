"""Asynchronous whole-block copies between the engine's KV layers and the host buffer."""

import itertools
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

import torch

from kvscope.connector.cpu_offload.copy.host_buffer import BlockLayout, HostBuffer
from kvscope.connector.cpu_offload.copy.plan import (
    CopyRun,
    plan_runs,
    split_at_multiples,
    split_scattered,
)


class Direction(StrEnum):
    STORE = "store"  # device -> host
    LOAD = "load"  # host -> device


class InjectedFault(RuntimeError):
    """A failure asked for by fault injection, reported like any other copy failure."""


@dataclass(frozen=True)
class CopyResult:
    """A finished job. duration_s covers the copy itself, not time spent queued or delayed."""

    job_id: int
    direction: Direction
    num_blocks: int
    num_bytes: int
    submitted_at: float
    finished_at: float
    duration_s: float
    error: str | None = None
    num_copies: int = 0  # copy operations the job took (memcpys, gathers): fewer is better

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def gib_per_s(self) -> float:
        return self.num_bytes / 2**30 / self.duration_s if self.duration_s > 0 else 0.0


@dataclass
class CopyJob:
    """A submitted job, as the backends see it."""

    job_id: int
    direction: Direction
    runs: list[CopyRun]
    num_blocks: int
    num_bytes: int
    submitted_at: float
    not_before: float  # injected delay: the job may not finish earlier than this
    fail_reason: str | None = None

    def result(self, duration_s: float, error: str | None, num_copies: int = 0) -> CopyResult:
        return CopyResult(
            job_id=self.job_id,
            direction=self.direction,
            num_blocks=self.num_blocks,
            num_bytes=self.num_bytes,
            submitted_at=self.submitted_at,
            finished_at=time.monotonic(),
            duration_s=duration_s,
            error=error,
            num_copies=num_copies,
        )


class CopyEngine(ABC):
    """Submit (device_block_ids, host_block_ids) jobs; poll() returns each result exactly once.

    A load finishes before any store submitted after it can overwrite the host blocks it
    reads, even if its lease expired meanwhile. A load need not wait for earlier stores (on
    CUDA it does not): the scheduler loads only from host blocks whose store was committed.
    """

    def __init__(self, kv_layers: Sequence[torch.Tensor], host_buffer: HostBuffer, block_dim: int):
        layout = BlockLayout.of(kv_layers, block_dim)
        if (layout.layer_block_shape, layout.dtype, layout.num_layers) != (
            host_buffer.layout.layer_block_shape,
            host_buffer.layout.dtype,
            host_buffer.layout.num_layers,
        ):
            raise ValueError(f"host buffer layout {host_buffer.layout} does not fit KV {layout}")
        self.layout: BlockLayout = layout
        self.kv_layers: list[torch.Tensor] = list(kv_layers)
        self.host_buffer: HostBuffer = host_buffer
        # With raw rows a block moves as its bytes, in runs as long as both sides allow;
        # otherwise (blocks not dense on the device) view by view, reordered by torch.
        self.raw_rows: bool = layout.raw_rows and (layout.block_order, layout.block_major) == (
            host_buffer.layout.block_order,
            host_buffer.layout.block_major,
        )
        self.device_tables: list[torch.Tensor] = (
            layout.device_rows(self.kv_layers) if self.raw_rows else self.kv_layers
        )
        self.host_tables: list[torch.Tensor] = (
            host_buffer.rows() if self.raw_rows else host_buffer.layers
        )
        self.table_block_dim: int = 0 if self.raw_rows else layout.block_dim
        first_row = self.host_tables[0][0]
        self._row_bytes: int = first_row.numel() * first_row.element_size()
        self._job_ids: itertools.count = itertools.count(1)
        self._closed: bool = False

    def submit_store(
        self,
        device_block_ids: Sequence[int],
        host_block_ids: Sequence[int],
        delay_s: float = 0.0,
        fail_reason: str | None = None,
    ) -> int:
        """Copies device blocks to host blocks; returns the job id."""
        return self._submit(Direction.STORE, device_block_ids, host_block_ids, delay_s, fail_reason)

    def submit_load(
        self,
        device_block_ids: Sequence[int],
        host_block_ids: Sequence[int],
        delay_s: float = 0.0,
        fail_reason: str | None = None,
    ) -> int:
        """Copies host blocks to device blocks; returns the job id."""
        return self._submit(Direction.LOAD, device_block_ids, host_block_ids, delay_s, fail_reason)

    @abstractmethod
    def poll(self) -> list[CopyResult]:
        """Results of jobs finished since the last poll, in completion order; never blocks."""

    @abstractmethod
    def wait(self, job_id: int, timeout_s: float | None = None) -> bool:
        """Blocks until the job finished (True) or the timeout passed (False)."""

    def cancel(self, job_id: int) -> bool:
        """Fails a job: its result, whenever it comes, reports 'cancelled'.

        True when the job is over now (it never copied, or its copy already ended): the blocks
        it names are free to hand back. False when its copy is still running and cannot be
        withdrawn (a CUDA stream cannot), or the job is unknown or reported: the caller must
        keep the blocks until poll() returns its result.
        """
        return False

    @property
    @abstractmethod
    def num_pending(self) -> int:
        """Jobs submitted and not yet finished."""

    def drain(self, timeout_s: float | None = None) -> list[CopyResult]:
        """Waits for every submitted job, then returns what poll() would."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        results: list[CopyResult] = []
        while True:
            results += self.poll()
            if self.num_pending == 0:
                return results + self.poll()
            if deadline is not None and time.monotonic() >= deadline:
                return results
            time.sleep(0.0005)

    def shutdown(self, timeout_s: float | None = None) -> None:
        """Finishes queued jobs and stops; results stay available to poll()."""
        self._closed = True

    def __enter__(self) -> "CopyEngine":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()

    @abstractmethod
    def _start(self, job: CopyJob) -> None:
        """Hands a validated job to the backend."""

    def _submit(
        self,
        direction: Direction,
        device_block_ids: Sequence[int],
        host_block_ids: Sequence[int],
        delay_s: float,
        fail_reason: str | None,
    ) -> int:
        if self._closed:
            raise RuntimeError("copy engine is shut down: create a new one")
        runs = plan_runs(
            device_block_ids,
            host_block_ids,
            self.layout.num_device_blocks,
            self.host_buffer.num_blocks,
        )
        if self.raw_rows:
            runs = split_scattered(runs, self._row_bytes)
        if (every := self.host_buffer.registration_blocks) is not None:
            runs = split_at_multiples(runs, every)  # each copy within one registration
        now = time.monotonic()
        job = CopyJob(
            job_id=next(self._job_ids),
            direction=direction,
            runs=runs,
            num_blocks=len(host_block_ids),
            num_bytes=len(host_block_ids) * self.layout.bytes_per_block,
            submitted_at=now,
            not_before=now + max(0.0, delay_s),
            fail_reason=fail_reason,
        )
        self._start(job)
        return job.job_id


def describe_error(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"
