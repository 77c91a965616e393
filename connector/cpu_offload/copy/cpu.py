"""CPU copy backend: one background thread runs jobs in order while the engine computes."""

import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import replace

import torch

from kvscope.connector.cpu_offload.copy.block_copy import load_runs, store_runs
from kvscope.connector.cpu_offload.copy.engine import (
    CopyEngine,
    CopyJob,
    CopyResult,
    Direction,
    InjectedFault,
    describe_error,
)
from kvscope.connector.cpu_offload.copy.host_buffer import HostBuffer


class CpuCopyEngine(CopyEngine):
    """Copies on a worker thread; torch releases the GIL inside copies, so they overlap.

    num_threads is the worker's own torch thread count (None: inherit). One thread by
    default: the forward pass owns the cores, and a second OpenMP team competing with it
    for them slows both down far more than a single-threaded memcpy costs.
    """

    def __init__(
        self,
        kv_layers: Sequence[torch.Tensor],
        host_buffer: HostBuffer,
        block_dim: int,
        num_threads: int | None = 1,
    ):
        super().__init__(kv_layers, host_buffer, block_dim)
        self.num_threads: int | None = num_threads
        # A blocking get() keeps the idle worker asleep instead of spinning.
        self._jobs: queue.SimpleQueue[CopyJob | None] = queue.SimpleQueue()
        self._lock: threading.Condition = threading.Condition()
        self._pending_ids: set[int] = set()
        self._cancelled: set[int] = set()
        self._copying: int | None = None
        self._finished: list[CopyResult] = []
        self._stopping: threading.Event = threading.Event()
        self._worker: threading.Thread = threading.Thread(
            target=self._run, name="kvscope-copy", daemon=True
        )
        self._worker_ready: threading.Event = threading.Event()
        threads_elsewhere = torch.get_num_threads()
        self._worker.start()
        self._worker_ready.wait()
        # set_num_threads also changes the default that threads started later inherit: put
        # it back. The worker keeps its own count, which it already applied.
        torch.set_num_threads(threads_elsewhere)

    def poll(self) -> list[CopyResult]:
        with self._lock:
            finished, self._finished = self._finished, []
            pending = bool(self._pending_ids)
        if pending:
            # The engine thread polls every step and rarely lets go of the GIL, which the
            # copy thread needs between torch calls: without this it waits up to a switch
            # interval (5 ms) each time, and a load of a few blocks took 50-100 ms.
            time.sleep(0)
        return finished

    def wait(self, job_id: int, timeout_s: float | None = None) -> bool:
        with self._lock:
            return self._lock.wait_for(lambda: job_id not in self._pending_ids, timeout_s)

    def cancel(self, job_id: int) -> bool:
        with self._lock:
            if job_id not in self._pending_ids:
                return False
            self._cancelled.add(job_id)
            # A copy under way runs to its end; its result still says cancelled.
            return job_id != self._copying

    @property
    def num_pending(self) -> int:
        with self._lock:
            return len(self._pending_ids)

    def drain(self, timeout_s: float | None = None) -> list[CopyResult]:
        with self._lock:
            self._lock.wait_for(lambda: not self._pending_ids, timeout_s)
        return self.poll()

    def shutdown(self, timeout_s: float | None = None) -> None:
        """Runs the jobs already queued, then joins the worker; injected delays are cut short."""
        if self._closed:
            return
        super().shutdown(timeout_s)
        self._stopping.set()
        self._jobs.put(None)
        self._worker.join(timeout_s)

    def _start(self, job: CopyJob) -> None:
        with self._lock:
            self._pending_ids.add(job.job_id)
        self._jobs.put(job)

    def _run(self) -> None:
        if self.num_threads is not None:
            torch.set_num_threads(self.num_threads)
        self._worker_ready.set()
        while (job := self._jobs.get()) is not None:
            result = self._execute(job)
            with self._lock:
                if job.job_id in self._cancelled:  # cancelled while it copied
                    self._cancelled.discard(job.job_id)
                    result = replace(result, error="cancelled")
                self._pending_ids.discard(job.job_id)
                self._copying = None
                self._finished.append(result)
                self._lock.notify_all()

    def _execute(self, job: CopyJob) -> CopyResult:
        # An injected delay waits in short slices, so a cancel stops it early.
        while (delay_s := job.not_before - time.monotonic()) > 0 and not self._stopping.is_set():
            if job.job_id in self._cancelled:
                break
            self._stopping.wait(min(delay_s, 0.01))
        with self._lock:
            if job.job_id in self._cancelled:
                self._cancelled.discard(job.job_id)
                return job.result(0.0, "cancelled")
            self._copying = job.job_id
        started = time.perf_counter()
        try:
            if job.fail_reason is not None:
                raise InjectedFault(job.fail_reason)
            copy = store_runs if job.direction is Direction.STORE else load_runs
            num_copies = copy(self.device_tables, self.host_tables, self.table_block_dim, job.runs)
            error = None
        except Exception as exc:  # reported to the caller through poll(), never raised here
            error, num_copies = describe_error(exc), 0
        return job.result(time.perf_counter() - started, error, num_copies)
