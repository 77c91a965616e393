"""The derive stage: decoded spans into rows (Facts), each span sent to the rows of its kind."""

from kvscope.backend.db.seqs import runs_of
from kvscope.backend.ingest import measures, request_rows, state_events
from kvscope.backend.ingest.facts import Facts
from kvscope.backend.ingest.record import Decoded, SpanRecord
from kvscope.backend.ingest.span_row import column_text, json_text, span_row
from kvscope.traces import names

LLM_REQUEST = "llm_request"
"""vLLM's own per-request span, whose gen_ai.latency.* attributes feed the TTFT breakdown."""


def derive(decoded: Decoded, received_ns: int) -> Facts:
    """The rows of every span in a decoded batch; received_ns stamps each span row."""
    facts = Facts()
    dumps = json_text
    seqs: dict[str, list[tuple[int, int]]] = {}
    for span in decoded.spans:
        attributes = span.attributes
        # Gaps are counted per seq origin, so every row says which origin it came from.
        span.instance_id = seq_origin(span, attributes)
        facts.points_before, facts.failures_before = len(facts.points), len(facts.failures)
        facts.spans.append(span_row(span, attributes, dumps, received_ns))
        _note_seq(facts, seqs, span, attributes)
        _by_name(facts, span, attributes)
        if span.events:
            _events(facts, span, attributes)
    facts.seqs = {origin: runs_of(pairs) for origin, pairs in seqs.items()}
    if facts.requests and facts.request_stubs:
        # A request whose own span is in this batch needs no 'running' stub first.
        finished = {(row["trace_id"], row["span_id"]) for row in facts.requests}
        facts.request_stubs = [
            stub
            for stub in facts.request_stubs
            if (stub["trace_id"], stub["span_id"]) not in finished
        ]
    return facts


def seq_origin(span: SpanRecord, attributes: dict) -> str | None:
    """The process start that numbered the span: kvscope's own origin, else the resource's."""
    return column_text(attributes.get(names.SEQ_ORIGIN)) or span.instance_id


def _note_seq(
    facts: Facts, seqs: dict[str, list[tuple[int, int]]], span: SpanRecord, attributes: dict
) -> None:
    """The span's origin, and its (seq, start) among that origin's (seqs)."""
    seq = attributes.get(names.SEQ)
    origin = span.instance_id
    if origin:
        known = facts.origins.get(origin)
        if known is None or (known[2] is None and names.KV_ROLE in attributes):
            role = column_text(attributes.get(names.KV_ROLE))
            facts.origins[origin] = (span.service_name, span.engine_id, role)
        if type(seq) is int:  # not a bool, which Python counts as an int
            seqs.setdefault(origin, []).append((seq, span.start_ns))


def _by_name(facts: Facts, span: SpanRecord, attributes: dict) -> None:
    name = span.name
    if name == names.SPAN_REQUEST:
        facts.requests.append(request_rows.request_row(span, attributes))
    elif name.startswith(names.SPAN_HOOK_PREFIX):
        request_rows.hook(facts, span, attributes)
    elif name == names.SPAN_TRANSFER:
        request_rows.transfer(facts, span, attributes)
    elif name == names.SPAN_REQUEST_EVENT:
        point = attributes.get(names.TIMELINE_POINT)
        has_event = any(e["name"] == names.EVENT_TIMELINE for e in span.events)
        if point and not has_event:
            request_rows.timeline_point(facts, span, attributes, str(point), span.start_ns)
    elif name == LLM_REQUEST:
        facts.latencies.append(measures.latency_row(span, attributes))
    elif name == names.SPAN_TELEMETRY:
        origin = span.instance_id
        if origin:
            emitted, dropped = (
                attributes.get(names.SPANS_EMITTED),
                attributes.get(names.SPANS_DROPPED),
            )
            previous = facts.telemetry.get(origin)
            if previous is None or previous[0] < span.end_ns:
                facts.telemetry[origin] = (span.end_ns, emitted, dropped)


def _events(facts: Facts, span: SpanRecord, attributes: dict) -> None:
    for event in span.events:
        event_name = event["name"]
        event_attributes = event["attributes"]
        if event_name == names.EVENT_TIMELINE:
            point = event_attributes.get(names.TIMELINE_POINT)
            if point:
                layer = event_attributes.get(names.LAYER_INDEX)
                request_rows.timeline_point(
                    facts,
                    span,
                    attributes,
                    str(point),
                    event["time_ns"],
                    layer=layer if isinstance(layer, int) else None,
                    request_id=column_text(event_attributes.get(names.REQUEST_ID)),
                )
        else:
            state_events.apply(facts, span, attributes, event)
