"""CPU copy backend: one background thread runs jobs in order while the engine computes."""

import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import replace

import torch

from kvscope.connector.cpu_offload.copy.block_copy import load_runs, store_runs
from kvscope.connector.cpu_offload.copy.cpu_rows import RowTables, load_rows, store_rows
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

    Jobs run one at a time, in submission order: on the worker, or on a thread that waits for
    the next job without a timeout (it would only sleep until the worker woke it).

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
        # Blocks on the tables' first dim (every raw-row layout): a job's copies in one torch
        # call, so the worker waits for the GIL once a job, not once a layer (cpu_rows.py).
        self._rows: RowTables | None = (
            RowTables.of(self.device_tables, self.host_tables)
            if self.table_block_dim == 0
            else None
        )
        # One lock; the worker sleeps on _work until a job is queued, waiters on _done.
        self._mutex: threading.Lock = threading.Lock()
        self._work: threading.Condition = threading.Condition(self._mutex)
        self._done: threading.Condition = threading.Condition(self._mutex)
        self._queue: deque[CopyJob] = deque()
        self._running: CopyJob | None = None  # taken off the queue, by the worker or a waiter
        self._copying: int | None = None  # the running job, once its copy began
        self._pending_ids: set[int] = set()
        self._cancelled: set[int] = set()
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
        with self._mutex:
            finished, self._finished = self._finished, []
            pending = bool(self._pending_ids)
        if pending:
            # The engine thread polls every step and rarely lets go of the GIL, which the
            # copy thread needs between torch calls: without this it waits up to a switch
            # interval (5 ms) each time, and a load of a few blocks took 50-100 ms.
            time.sleep(0)
        return finished

    def wait(self, job_id: int, timeout_s: float | None = None) -> bool:
        """Without a timeout, a job next in line that the worker has not taken yet is copied
        on this thread: it blocks anyway (a preempted request's stores, a bench), and copying
        here spares waking the worker and being woken back, two thread hand-offs a job."""
        if timeout_s is None and (job := self._take(job_id)) is not None:
            try:
                result = self._copy_timed(job)
            except BaseException:  # interrupted here: the worker must not wait on it forever
                self._finish(job, job.result(0.0, "interrupted"))
                raise
            self._finish(job, result)
            return True
        with self._done:
            return self._done.wait_for(lambda: job_id not in self._pending_ids, timeout_s)

    def cancel(self, job_id: int) -> bool:
        with self._mutex:
            if job_id not in self._pending_ids:
                return False
            self._cancelled.add(job_id)
            # A copy under way runs to its end; its result still says cancelled.
            return job_id != self._copying

    @property
    def num_pending(self) -> int:
        with self._mutex:
            return len(self._pending_ids)

    def drain(self, timeout_s: float | None = None) -> list[CopyResult]:
        with self._done:
            self._done.wait_for(lambda: not self._pending_ids, timeout_s)
        return self.poll()

    def shutdown(self, timeout_s: float | None = None) -> None:
        """Runs the jobs already queued, then joins the worker; injected delays are cut short."""
        if self._closed:
            return
        super().shutdown(timeout_s)
        self._stopping.set()
        with self._work:
            self._work.notify()
        self._worker.join(timeout_s)

    def _start(self, job: CopyJob) -> None:
        with self._work:
            self._pending_ids.add(job.job_id)
            self._queue.append(job)
            self._work.notify()

    def _take(self, job_id: int) -> CopyJob | None:
        """The job, off the queue, if it is next, nothing runs, and it may copy now."""
        with self._mutex:
            if self._running is not None or not self._queue or self._queue[0].job_id != job_id:
                return None
            job = self._queue[0]
            if job.job_id in self._cancelled or job.not_before > time.monotonic():
                return None
            self._running = self._queue.popleft()
            self._copying = job.job_id
            return job

    def _run(self) -> None:
        if self.num_threads is not None:
            torch.set_num_threads(self.num_threads)
        self._worker_ready.set()
        while (job := self._next()) is not None:
            self._finish(job, self._execute(job))

    def _next(self) -> CopyJob | None:
        """The next job, once no other runs (jobs run one at a time, in order); None once
        shut down with nothing queued. A blocking wait keeps the idle worker asleep."""
        with self._work:
            while self._running is not None or not self._queue:
                if self._stopping.is_set() and not self._queue and self._running is None:
                    return None
                self._work.wait()
            self._running = self._queue.popleft()
            return self._running

    def _finish(self, job: CopyJob, result: CopyResult) -> None:
        with self._mutex:
            if job.job_id in self._cancelled:  # cancelled while it copied
                self._cancelled.discard(job.job_id)
                result = replace(result, error="cancelled")
            self._pending_ids.discard(job.job_id)
            self._running = self._copying = None
            self._finished.append(result)
            self._done.notify_all()
            if self._queue or self._stopping.is_set():  # else the worker has nothing to do
                self._work.notify()

    def _execute(self, job: CopyJob) -> CopyResult:
        # An injected delay waits in short slices, so a cancel stops it early.
        while (delay_s := job.not_before - time.monotonic()) > 0 and not self._stopping.is_set():
            if job.job_id in self._cancelled:
                break
            self._stopping.wait(min(delay_s, 0.01))
        with self._mutex:
            if job.job_id in self._cancelled:
                self._cancelled.discard(job.job_id)
                return job.result(0.0, "cancelled")
            self._copying = job.job_id
        return self._copy_timed(job)

    def _copy_timed(self, job: CopyJob) -> CopyResult:
        started = time.perf_counter()
        try:
            if job.fail_reason is not None:
                raise InjectedFault(job.fail_reason)
            num_copies = self._copy(job)
            error = None
        except Exception as exc:  # reported to the caller through poll(), never raised here
            error, num_copies = describe_error(exc), 0
        return job.result(time.perf_counter() - started, error, num_copies)

    def _copy(self, job: CopyJob) -> int:
        store = job.direction is Direction.STORE
        if self._rows is not None:
            return (store_rows if store else load_rows)(self._rows, job.runs)
        copy = store_runs if store else load_runs
        return copy(self.device_tables, self.host_tables, self.table_block_dim, job.runs)
