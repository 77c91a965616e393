"""Span processors: per-process sequence numbers, and a bounded batch queue that counts drops."""

import itertools
import logging
import os
import random
import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.id_generator import IdGenerator

from kvscope.traces import names

logger = logging.getLogger(__name__)


class SequenceProcessor(SpanProcessor):
    """Numbers every span of this process in end order, so the backend can see lost spans.

    Spans leave in end order: numbered at start, a request span open for a minute would
    leave a hole in the receiver's sequence for that minute, which reads as lost spans. The
    number is written in the SDK's OnEnding hook (`_on_ending`, before any exporter sees the
    span); an SDK without that hook numbers at start, as before.
    """

    def __init__(self, origin: str) -> None:
        self._next = itertools.count()
        self._origin = origin
        self._at_end = hasattr(SpanProcessor, "_on_ending")
        self.ended = 0

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        if not self._at_end:  # an SDK without OnEnding: numbered here, as before
            span.set_attributes({names.SEQ: next(self._next), names.SEQ_ORIGIN: self._origin})

    def _on_ending(self, span: Span) -> None:
        if not self._at_end:
            return
        attributes = getattr(span, "_attributes", None)
        frozen = getattr(attributes, "_immutable", None)
        if attributes is None or frozen is None:  # an SDK whose span keeps its attributes otherwise
            return
        # The SDK freezes attributes just before OnEnding; the spec lets OnEnding change them.
        attributes._immutable = False
        try:
            # Both here, none at start: one validated write less a span, and a span started
            # before this processor joined the provider (vLLM's own start-up spans) gets its
            # number and origin like the rest.
            attributes[names.SEQ] = next(self._next)
            attributes[names.SEQ_ORIGIN] = self._origin
        finally:
            attributes._immutable = frozen

    def on_end(self, span: ReadableSpan) -> None:
        self.ended += 1


@dataclass
class ExportCounters:
    """What one exporter's queue did with the spans it was given."""

    queued: int = 0
    exported: int = 0
    dropped_queue_full: int = 0
    dropped_export_failed: int = 0

    @property
    def dropped(self) -> int:
        return self.dropped_queue_full + self.dropped_export_failed


class BoundedBatchProcessor(SpanProcessor):
    """Hands ended spans to a background exporter thread through a bounded queue.

    on_end never waits: when the queue is full the span is dropped and counted. This is the
    guarantee the engine needs (the SDK's BatchSpanProcessor also drops, but logs every drop
    and exposes no count to read back).
    """

    def __init__(
        self,
        exporter: SpanExporter,
        max_queue_size: int = 4096,
        max_batch_size: int = 512,
        schedule_delay_s: float = 0.5,
    ) -> None:
        self.exporter = exporter
        self.counters = ExportCounters()
        self._queue: deque[ReadableSpan] = deque()
        self._max_queue_size = max_queue_size
        self._max_batch_size = max_batch_size
        self._delay_s = schedule_delay_s
        self._wake = threading.Event()
        self._flushed = threading.Condition()
        self._stopping = False
        self._exporting = 0
        self._thread = threading.Thread(target=self._run, name="kvscope-span-export", daemon=True)
        self._thread.start()

    def on_end(self, span: ReadableSpan) -> None:
        if len(self._queue) >= self._max_queue_size or self._stopping:
            self.counters.dropped_queue_full += 1
            return
        self._queue.append(span)
        self.counters.queued += 1
        if len(self._queue) >= self._max_batch_size:
            self._wake.set()

    def _run(self) -> None:
        while not self._stopping:
            self._wake.wait(self._delay_s)
            self._wake.clear()
            self._drain()
        self._drain()

    def _drain(self) -> None:
        while self._queue:
            size = min(len(self._queue), self._max_batch_size)
            self._exporting = size
            self._export([self._queue.popleft() for _ in range(size)])
            self._exporting = 0
        with self._flushed:
            self._flushed.notify_all()

    def _export(self, batch: Sequence[ReadableSpan]) -> None:
        try:
            ok = self.exporter.export(batch) == SpanExportResult.SUCCESS
        except Exception:  # an exporter bug must not kill the export thread
            logger.exception("span exporter %s raised", type(self.exporter).__name__)
            ok = False
        if ok:
            self.counters.exported += len(batch)
        else:
            self.counters.dropped_export_failed += len(batch)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        with self._flushed:
            self._wake.set()
            idle = lambda: not self._queue and not self._exporting  # noqa: E731
            return self._flushed.wait_for(idle, timeout_millis / 1000)

    def shutdown(self) -> None:
        self._stopping = True
        self._wake.set()
        self._thread.join(timeout=10)
        self.exporter.shutdown()


class SystemRandomIdGenerator(IdGenerator):
    """Trace and span ids from a generator of this process's own, seeded from os.urandom.

    The SDK's default draws from Python's global `random`, which vLLM seeds (seed=0 by
    default for LLM): every engine process would then produce the same ids in the same order.
    A private generator is as unpredictable across processes and costs no system call per id;
    a forked child reseeds, so it never repeats its parent's ids.
    """

    def __init__(self) -> None:
        self._reseed()
        os.register_at_fork(after_in_child=self._reseed)

    def _reseed(self) -> None:
        self._random = random.Random(os.urandom(32))

    def generate_span_id(self) -> int:
        return self._random.getrandbits(64) or 1

    def generate_trace_id(self) -> int:
        return self._random.getrandbits(128) or 1
