"""Replayable OTLP bodies for the scale bench: one encoded template, rewritten per batch so
every batch has its own traces, request ids, seq numbers and times (cheap: no SDK per span)."""

import random
import time

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as pb

from kvscope.bench.backend.ingest_clients import (
    BATCH,
    MS,
    make_tracer,
    request_spans,
    vllm_request_id,
)
from kvscope.traces import names

REQUEST_EVERY_NS = 25 * MS
"""One request every 25 ms: 10M spans span about seven hours of a busy engine."""


class Batches:
    """Batch b of a run: the template's requests moved to their own ids and times."""

    def __init__(self, total_spans: int) -> None:
        tracer, collector = make_tracer("bench-scale")
        index = 0
        while len(collector.spans) < BATCH:
            request_spans(tracer, index, index * REQUEST_EVERY_NS)
            index += 1
        self.requests = index
        self.spans = len(collector.spans)
        self.count = max(1, total_spans // self.spans)
        self.template = encode_spans(collector.spans)
        # The last batch ends about now: windows of the last minutes hold the newest spans.
        self.t0 = time.time_ns() - self.count * self.requests * REQUEST_EVERY_NS
        self.end_ns = self.t0 + self.count * self.requests * REQUEST_EVERY_NS

    def body(self, batch: int) -> bytes:
        request = pb.ExportTraceServiceRequest()
        request.CopyFrom(self.template)
        shift = self.t0 + batch * self.requests * REQUEST_EVERY_NS
        # Random trace ids, as OTel makes them, and random request ids, as vLLM makes them
        # (indexes led by them take random inserts; ids that grew with the batch would make
        # those indexes append-only and the fill look cheaper than in production).
        rng = random.Random(batch)
        trace_ids: dict[bytes, bytes] = {}
        request_ids: dict[str, str] = {}
        for resource_spans in request.resource_spans:
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    new_id = trace_ids.get(span.trace_id)
                    if new_id is None:
                        new_id = trace_ids[span.trace_id] = rng.randbytes(16)
                    self._move(span, batch, new_id, shift, request_ids, rng)
        return request.SerializeToString()

    def _move(
        self,
        span,
        batch: int,
        trace_id: bytes,
        shift: int,
        request_ids: dict[str, str],
        rng: random.Random,
    ) -> None:
        span.trace_id = trace_id  # span and parent ids stay: per trace
        span.start_time_unix_nano += shift
        span.end_time_unix_nano += shift
        for event in span.events:
            event.time_unix_nano += shift
        for attribute in span.attributes:
            if attribute.key == names.REQUEST_ID:
                old = attribute.value.string_value
                new = request_ids.get(old)
                if new is None:
                    new = request_ids[old] = vllm_request_id(rng)
                attribute.value.string_value = new
            elif attribute.key == names.SEQ:
                attribute.value.int_value += batch * self.spans
