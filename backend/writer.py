"""One OTLP export request stored: decoded and derived (anywhere), written in one transaction."""

import logging
import threading
import time
from dataclasses import dataclass, field

from sqlalchemy import Engine
from sqlalchemy.exc import OperationalError

from kvscope.backend import otlp
from kvscope.backend.derive import Facts, derive
from kvscope.backend.limits import Limits
from kvscope.backend.store import write_batch

logger = logging.getLogger(__name__)


class StoreUnavailable(RuntimeError):
    """The database refused the batch for a passing reason: the client should retry."""


@dataclass(slots=True)
class Prepared:
    """An export request decoded and turned into rows, ready to write (and to pickle)."""

    facts: Facts | None  # None when no span was valid
    resources: dict[str, dict]
    rejected: int
    message: str | None
    received_ns: int


def prepare(body: bytes, content_type: str, limits: Limits) -> Prepared:
    """The pure-Python part of ingest; PayloadError if the body cannot be read at all."""
    request = otlp.parse_body(body, content_type)
    decoded = otlp.decode(request, limits)
    received_ns = time.time_ns()
    facts = derive(decoded, received_ns) if decoded.spans else None
    return Prepared(facts, decoded.resources, decoded.rejected, decoded.message, received_ns)


@dataclass(slots=True)
class LiveUpdate:
    """What the WebSocket needs of one stored batch: its message and the requests it ended."""

    message: dict
    finished: list[tuple[str, str, str | None]]  # (trace_id, span_id, instance_id)


@dataclass(slots=True)
class Stored:
    """The answer to one export request: spans stored, spans rejected and why."""

    spans: int
    rejected: int
    message: str | None
    live: LiveUpdate | None = field(default=None)


class BatchWriter:
    """The one writer of a database in this server: a transaction per batch, one at a time
    (SQLite has a single writer, and one connection keeps its page cache warm)."""

    def __init__(self, engine: Engine, max_timelines: int) -> None:
        self.engine = engine
        self.max_timelines = max_timelines
        self.lock = threading.Lock()
        # The write path uses the driver's own cursor, so its errors come unwrapped too.
        self._passing_errors = (OperationalError, engine.dialect.dbapi.OperationalError)

    def write(self, prepared: Prepared, live: bool = False) -> Stored:
        """Writes a prepared batch; StoreUnavailable if the database failed for a passing
        reason. `live`: also return what the WebSocket pushes about this batch."""
        facts = prepared.facts
        if facts is None:
            return Stored(0, prepared.rejected, prepared.message)
        with self.lock:
            try:
                with self.engine.begin() as connection:
                    write_batch(connection, facts, prepared.resources, prepared.received_ns)
            except self._passing_errors as error:
                logger.warning("batch of %d spans not stored: %s", len(facts.spans), error)
                reason = getattr(error, "orig", error)
                raise StoreUnavailable(f"database unavailable, retry later: {reason}") from None
        update = live_update(facts, self.max_timelines) if live else None
        return Stored(len(facts.spans), prepared.rejected, prepared.message, update)


def live_update(facts: Facts, max_timelines: int) -> LiveUpdate:
    finished = [
        (row["trace_id"], row["span_id"], row["instance_id"])
        for row in facts.requests[:max_timelines]
    ]
    return LiveUpdate(batch_message(facts), finished)


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
