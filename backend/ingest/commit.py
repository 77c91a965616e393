"""Commits prepared batches: one transaction at a time, queued batches together (group commit)."""

import logging
import threading
from dataclasses import dataclass, field

from sqlalchemy import Engine
from sqlalchemy.exc import OperationalError

from kvscope.backend.ingest.facts import Facts
from kvscope.backend.ingest.prepare import Prepared
from kvscope.backend.ingest.write import write_rows

logger = logging.getLogger(__name__)


class StoreUnavailable(RuntimeError):
    """The database refused the batch for a passing reason: the client should retry."""


@dataclass(slots=True)
class LiveUpdate:
    """What the WebSocket needs of one stored batch: its message and the requests it ended."""

    message: dict
    # (request_no, trace_id, span_id, instance_id): the request table's key, then the process
    finished: list[tuple[int, str, str, str | None]]


@dataclass(slots=True)
class Stored:
    """The answer to one export request: spans stored, spans rejected and why."""

    spans: int
    rejected: int
    message: str | None
    live: LiveUpdate | None = field(default=None)
    new_spans: int = 0  # of `spans`, those not stored before (an exporter's retry has none)


RETRIED_SQLSTATES = {"40P01": "deadlock", "40001": "serialization failure"}
"""PostgreSQL's errors that roll back a transaction only because another one ran beside it
(two backends' batches whose rollup rows or requests cross): written again at once, as
PostgreSQL's manual advises, instead of failing the export request."""

TRANSACTION_ATTEMPTS = 3
"""Writes of one transaction before the database's refusal goes back to the client (503)."""

MAX_GROUP_SPANS = 8192
"""Group commit: batches waiting for the writer are committed together, up to this many spans."""


@dataclass(slots=True)
class _Waiting:
    """A batch queued for the writer, and what became of it."""

    prepared: Prepared
    facts: Facts  # the prepared batch's (only batches with facts are queued)
    done: bool = False
    error: BaseException | None = None
    new_spans: int = 0


class Committer:
    """The one writer of a database in this server, one transaction at a time (SQLite has a
    single writer, and one connection keeps its page cache warm). On SQLite the batches that
    queued while a transaction ran are written by the next one together (group commit: one
    commit, and the index pages they share written to the WAL once); each export request is
    answered only after the commit that holds its batch."""

    def __init__(self, engine: Engine, max_timelines: int, group: bool = True) -> None:
        self.engine = engine
        self.max_timelines = max_timelines
        self.lock = threading.Lock()
        self._queue: list[_Waiting] = []
        self._queue_lock = threading.Lock()
        # PostgreSQL's staging tables empty at commit: one batch per transaction there.
        self._group = group and engine.dialect.name == "sqlite"
        # The write path uses the driver's own cursor, so its errors come unwrapped too.
        dbapi = engine.dialect.dbapi
        assert dbapi is not None  # an engine made by create_engine has imported its driver
        self._passing_errors = (OperationalError, dbapi.OperationalError)

    def commit(self, prepared: Prepared, live: bool = False) -> Stored:
        """Commits a prepared batch; StoreUnavailable if the database failed for a passing
        reason. `live`: also return what the WebSocket pushes about this batch."""
        facts = prepared.facts
        if facts is None:
            return Stored(0, prepared.rejected, prepared.message)
        waiting = _Waiting(prepared, facts)
        with self._queue_lock:
            self._queue.append(waiting)
        with self.lock:
            if not waiting.done:  # else an earlier holder of the lock wrote it with its own
                self._commit_group(self._take(waiting))
        if waiting.error is not None:
            raise waiting.error
        update = live_update(facts, self.max_timelines) if live else None
        spans = len(facts.spans)
        return Stored(spans, prepared.rejected, prepared.message, update, waiting.new_spans)

    def _take(self, mine: _Waiting) -> list[_Waiting]:
        """The queued batches, oldest first, up to MAX_GROUP_SPANS (always including mine)."""
        with self._queue_lock:
            if not self._group:
                self._queue.remove(mine)
                return [mine]
            group: list[_Waiting] = []
            spans = 0
            for waiting in self._queue:
                size = len(waiting.facts.spans)
                if group and spans + size > MAX_GROUP_SPANS and mine in group:
                    break
                group.append(waiting)
                spans += size
            del self._queue[: len(group)]
            return group

    def _commit_group(self, group: list[_Waiting]) -> None:
        try:
            self._transaction(group)
        except Exception as error:
            if len(group) == 1:
                group[0].error = error
            else:  # one bad batch must not fail the others: each alone
                for waiting in group:
                    try:
                        self._transaction([waiting])
                    except Exception as alone:
                        waiting.error = alone
        for waiting in group:
            waiting.done = True

    def _transaction(self, group: list[_Waiting]) -> None:
        for attempt in range(1, TRANSACTION_ATTEMPTS + 1):
            try:
                with self.engine.begin() as connection:
                    for waiting in group:
                        prepared = waiting.prepared
                        waiting.new_spans = write_rows(
                            connection, waiting.facts, prepared.resources, prepared.received_ns
                        )
                return
            except self._passing_errors as error:
                reason = getattr(error, "orig", error)
                spans = sum(len(waiting.facts.spans) for waiting in group)
                retried = RETRIED_SQLSTATES.get(getattr(reason, "sqlstate", ""))
                if retried and attempt < TRANSACTION_ATTEMPTS:
                    logger.info(
                        "%d batch(es) of %d spans rolled back by a %s: writing them again "
                        "(attempt %d of %d)",
                        len(group),
                        spans,
                        retried,
                        attempt + 1,
                        TRANSACTION_ATTEMPTS,
                    )
                    continue
                logger.warning("%d batch(es) of %d spans not stored: %s", len(group), spans, error)
                raise StoreUnavailable(f"database unavailable, retry later: {reason}") from None


def live_update(facts: Facts, max_timelines: int) -> LiveUpdate:
    """After the write, which numbered the request rows (backend/db/request_numbers.py)."""
    finished = [
        (row["request_no"], row["trace_id"], row["span_id"], row["instance_id"])
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
