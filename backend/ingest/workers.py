"""Ingest worker processes: each decodes and derives whole batches off the server's GIL.

Decoding and deriving are pure Python, so one process tops out at one core however many
exporters send at once. Workers return the rows (marshalled: prepare.to_wire); the server
writes them through its one connection (SQLite has a single writer, and a connection per
worker would find its page cache stale after every other worker's commit).
"""

import gc
import logging
import multiprocessing
import os
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from kvscope.backend.ingest.bound import Limits
from kvscope.backend.ingest.commit import StoreUnavailable
from kvscope.backend.ingest.prepare import Prepared, from_wire, prepare, to_wire

logger = logging.getLogger(__name__)

WATCH_INTERVAL_S = 1.0
"""How often a worker checks that the server that started it is still its parent."""

_limits: Limits | None = None
"""The worker process's limits, set once by `_start_worker`."""

WORKER_GC_THRESHOLD = 20_000
"""Allocations between a worker's young-generation collections (CPython's default: 700). A
batch's objects are acyclic and freed by reference counting once it is sent back, so the
collector finds nothing; at the defaults, with the imports' objects scanned by every full
collection, it took 1.5-2 of the 15 microseconds a span costs a worker (OTel exporter
bodies, one process, measured alternating)."""


def _start_worker(limits: Limits, server_pid: int) -> None:
    global _limits
    _limits = limits
    gc.freeze()  # what the imports made lives as long as the process: never scanned again
    gc.set_threshold(WORKER_GC_THRESHOLD)
    threading.Thread(
        target=_exit_with, args=(server_pid,), name="watch-server", daemon=True
    ).start()


def _exit_with(server_pid: int) -> None:
    """Ends this worker once the server is gone (even SIGKILLed): the pool's queues never
    tell a spawned worker, which holds both ends of their pipes."""
    while os.getppid() == server_pid:
        time.sleep(WATCH_INTERVAL_S)
    os._exit(0)


def _prepare(body: bytes, content_type: str) -> bytes:
    assert _limits is not None  # set by the pool's initializer, before any task
    return to_wire(prepare(body, content_type, _limits))


def _ready() -> bool:
    return _limits is not None


class IngestPool:
    """`workers` spawned processes that prepare batches with the server's limits."""

    def __init__(self, limits: Limits, workers: int) -> None:
        self.workers = workers
        self._arguments = (limits, os.getpid())
        self._lock = threading.Lock()
        self._executor = self._new_executor()
        self._warming: list = []

    def _new_executor(self) -> ProcessPoolExecutor:
        # spawn, not fork: the server has threads (and an event loop) that a fork would copy.
        return ProcessPoolExecutor(
            self.workers,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_start_worker,
            initargs=self._arguments,
        )

    def warm_up(self) -> None:
        """Starts every worker now, so that the first batches do not wait for imports."""
        self._warming = [self._executor.submit(_ready) for _ in range(self.workers)]

    @property
    def ready(self) -> bool:
        """Every worker has started (after warm_up); batches may still be served before."""
        return all(future.done() for future in self._warming)

    def prepare(self, body: bytes, content_type: str) -> Prepared:
        """Prepares one export request in a worker; its errors come back as raised there."""
        executor = self._executor
        try:
            wire = executor.submit(_prepare, body, content_type).result()
        except BrokenProcessPool:
            # A worker died (killed, out of memory); nothing of the batch was written.
            self._replace(executor)
            raise StoreUnavailable("an ingest worker process died; retry the batch") from None
        return from_wire(wire)

    def _replace(self, broken: ProcessPoolExecutor) -> None:
        with self._lock:
            if self._executor is broken:
                logger.error("an ingest worker process died; starting a new pool")
                broken.shutdown(wait=False, cancel_futures=True)
                self._executor = self._new_executor()
                self.warm_up()

    def close(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)
