"""The ingest service: decode, derive, write one transaction per batch, prune, publish."""

import logging
import threading
import time

from sqlalchemy import Engine
from sqlalchemy.exc import OperationalError

from kvscope.backend import otlp, retention
from kvscope.backend.derive import Facts, derive
from kvscope.backend.limits import Limits
from kvscope.backend.live import Hub
from kvscope.backend.settings import Settings
from kvscope.backend.store import write_batch

logger = logging.getLogger(__name__)


class StoreUnavailable(RuntimeError):
    """The database refused the batch for a passing reason: the client should retry."""


class IngestService:
    """One per app; batches are serialized because SQLite has a single writer anyway."""

    def __init__(self, engine: Engine, settings: Settings, hub: Hub, on_batch=None) -> None:
        self.engine = engine
        self.settings = settings
        self.hub = hub
        self.limits = Limits.from_settings(settings)
        self.on_batch = on_batch
        self.spans_stored = 0
        self._write_lock = threading.Lock()
        # The write path uses the driver's own cursor, so its errors come unwrapped too.
        self._passing_errors = (OperationalError, engine.dialect.dbapi.OperationalError)
        self._last_prune = time.monotonic()

    def ingest(self, body: bytes, content_type: str) -> otlp.Decoded:
        """Stores every valid span of one export request; PayloadError if none can be read."""
        request = otlp.parse_body(body, content_type)
        decoded = otlp.decode(request, self.limits)
        if not decoded.spans:
            return decoded
        now_ns = time.time_ns()
        facts = derive(decoded, now_ns)
        with self._write_lock:
            try:
                with self.engine.begin() as connection:
                    write_batch(connection, facts, decoded.resources, now_ns)
            except self._passing_errors as error:
                logger.warning("batch of %d spans not stored: %s", len(facts.spans), error)
                reason = getattr(error, "orig", error)
                raise StoreUnavailable(f"database unavailable, retry later: {reason}") from None
            self.spans_stored += len(facts.spans)
            if time.monotonic() - self._last_prune >= self.settings.retention_interval_s:
                self._prune_quietly(now_ns)
        if self.on_batch is not None and self.hub.has_clients:
            self.on_batch(facts)
        return decoded

    def prune(self, now_ns: int | None = None) -> int:
        """Applies the retention limits now; returns how many spans were removed."""
        with self._write_lock:
            return self._prune(now_ns or time.time_ns())

    def _prune_quietly(self, now_ns: int) -> None:
        """Retention after a batch: the batch is committed, so a failure here is only logged
        (an error answer would make the exporter send the stored batch again)."""
        try:
            self._prune(now_ns)
        except Exception:
            logger.exception("retention pass failed; the next batch tries again")

    def _prune(self, now_ns: int) -> int:
        self._last_prune = time.monotonic()
        with self.engine.begin() as connection:
            removed = retention.prune(
                connection,
                self.settings.retention_max_spans,
                self.settings.retention_max_age_s,
                now_ns,
            )
        if removed:
            logger.info("retention removed %d spans", removed)
        return removed


def batch_message(facts: Facts, limit: int = 500) -> dict:
    """The WebSocket message for one stored batch: what changed, bounded in size."""
    return {
        "type": "batch",
        "spans": len(facts.spans),
        "requests": [
            {k: r[k] for k in ("trace_id", "span_id", "request_id", "engine_id", "status")}
            for r in (facts.requests + facts.request_stubs)[:limit]
        ],
        "blocks": facts.blocks[:limit],
        "leases": facts.leases[:limit],
        "failures": facts.failures[:limit],
        "transfers": facts.transfers[:limit],
    }
