"""The ingest pipeline: prepare each batch (here or in a worker), commit, prune, publish."""

import logging
import time
from typing import Protocol

from sqlalchemy import Engine

from kvscope.backend.db import liveness, retention
from kvscope.backend.db.checkpoint import Checkpointer
from kvscope.backend.ingest.bound import Limits
from kvscope.backend.ingest.commit import Committer, Stored
from kvscope.backend.ingest.metrics import IngestMetrics
from kvscope.backend.ingest.prepare import prepare
from kvscope.backend.ingest.workers import IngestPool
from kvscope.backend.settings import Settings

logger = logging.getLogger(__name__)


class Listeners(Protocol):
    """Who would take the batch's live changes (the app's WebSocket hub)."""

    @property
    def has_clients(self) -> bool: ...


class Pipeline:
    """One per app. Batches are decoded by `settings.ingest_workers` worker processes (or in
    the calling thread when that is 0) and written one at a time by this process."""

    def __init__(self, engine: Engine, settings: Settings, hub: Listeners, on_batch=None) -> None:
        self.engine = engine
        self.settings = settings
        self.hub = hub
        self.on_batch = on_batch
        self.spans_stored = 0
        self.metrics = IngestMetrics()
        self.limits = Limits.from_settings(settings)
        self.writer = Committer(
            engine, settings.ws_max_timelines_per_batch, group=settings.group_commit
        )
        workers = settings.resolved_ingest_workers()
        self.pool = IngestPool(self.limits, workers) if workers else None
        self.checkpointer = Checkpointer(engine, self.writer.lock)
        self.checkpointer.start()
        self._last_prune = time.monotonic()

    def ingest(self, body: bytes, content_type: str) -> Stored:
        """Stores every valid span of one export request; PayloadError if none can be read,
        StoreUnavailable if the database (or a worker) failed for a passing reason."""
        started = time.perf_counter()
        try:
            stored = self._ingest(body, content_type)
        except Exception as error:
            self.metrics.refused(error)
            raise
        elapsed_s = time.perf_counter() - started
        self.metrics.stored_batch(stored.spans, stored.new_spans, stored.rejected, elapsed_s)
        return stored

    def _ingest(self, body: bytes, content_type: str) -> Stored:
        if self.pool is not None:
            prepared = self.pool.prepare(body, content_type)
        else:
            prepared = prepare(body, content_type, self.limits)
        live = self.on_batch is not None and self.hub.has_clients
        stored = self.writer.commit(prepared, live)
        self.spans_stored += stored.new_spans
        interval = self.settings.retention_interval_s
        if stored.spans and time.monotonic() - self._last_prune >= interval:
            self._prune_quietly(time.time_ns())
        if stored.live is not None and self.on_batch is not None:
            self.on_batch(stored.live)
        return stored

    def warm_up(self) -> None:
        if self.pool is not None:
            self.pool.warm_up()

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
        self.checkpointer.stop()

    def prune(self, now_ns: int | None = None) -> int:
        """Applies the retention limits now; returns how many spans were removed."""
        return self._prune(now_ns or time.time_ns())

    def _prune_quietly(self, now_ns: int) -> None:
        """Retention after a batch: the batch is committed, so a failure here is only logged
        (an error answer would make the exporter send the stored batch again)."""
        try:
            self._prune(now_ns)
        except Exception:
            logger.exception("retention pass failed; the next batch tries again")

    def _prune(self, now_ns: int) -> int:
        """Retention in bounded steps, the writer lock taken per step (batches get in between),
        then engines that stopped reporting are closed."""
        self._last_prune = time.monotonic()
        removed, more = 0, True
        while more:
            with self.writer.lock, self.engine.begin() as connection:
                step, more = retention.prune_step(
                    connection,
                    self.settings.retention_max_spans,
                    self.settings.retention_max_age_s,
                    now_ns,
                )
            removed += step
        with self.writer.lock, self.engine.begin() as connection:
            liveness.close_lost(connection, now_ns, self.settings.engine_lost_after_s)
        if removed:
            logger.info("retention removed %d spans", removed)
        return removed
