"""Turns decoded spans into rows: spans, requests, timeline points, transfers, state facts."""

import json
from dataclasses import dataclass, field
from json.encoder import c_make_encoder, encode_basestring_ascii

from kvscope.backend.ingest import measures, state_events
from kvscope.backend.ingest.record import Decoded, SpanRecord, clean
from kvscope.traces import names

REQUEST_STATUS = "kvscope.request.status"
"""Set by traces.scheduler_spans on the request span; not yet a constant in traces.names."""

LLM_REQUEST = "llm_request"
"""vLLM's own per-request span, whose gen_ai.latency.* attributes feed the TTFT breakdown."""

_LOOKUP_HOOK = names.SPAN_HOOK_PREFIX + "get_num_new_matched_tokens"
_ALLOC_HOOK = names.SPAN_HOOK_PREFIX + "update_state_after_alloc"
_FINISH_HOOKS = {
    names.SPAN_HOOK_PREFIX + "request_finished",
    names.SPAN_HOOK_PREFIX + "request_finished_all_groups",
}
_STATUS_ERROR = 2


def _json_text_function():
    """Compact JSON text of attribute trees; the C encoder is built once, not per call.

    Decoded OTLP values are trees (no cycles), so the circular-reference check is off.
    """
    if c_make_encoder is None:  # a Python without the C accelerator
        return json.JSONEncoder(separators=(",", ":"), default=str).encode
    encoder = c_make_encoder(None, str, encode_basestring_ascii, None, ":", ",", False, False, True)
    return lambda value: "".join(encoder(value, 0))


json_text = _json_text_function()


@dataclass
class Facts:
    """Rows to write for one batch, grouped by table."""

    spans: list[tuple] = field(default_factory=list)
    requests: list[dict] = field(default_factory=list)
    request_stubs: list[dict] = field(default_factory=list)
    points: list[dict] = field(default_factory=list)
    transfers: list[dict] = field(default_factory=list)
    failures: list[dict] = field(default_factory=list)
    lookups: list[dict] = field(default_factory=list)
    latencies: list[dict] = field(default_factory=list)
    leases: list[dict] = field(default_factory=list)
    blocks: list[dict] = field(default_factory=list)
    seqs: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    telemetry: dict[str, tuple[int, int | None, int | None]] = field(default_factory=dict)
    # origin -> (service name, engine id, kv role) of the process that numbered the spans
    origins: dict[str, tuple[str | None, str | None, str | None]] = field(default_factory=dict)
    stub_keys: set[tuple[str, str]] = field(default_factory=set)
    # Row counts before the current span: ordinals count within one span, so a span sent
    # twice (an exporter retry) yields the same keys and is stored once.
    points_before: int = 0
    failures_before: int = 0


def derive(decoded: Decoded, received_ns: int) -> Facts:
    facts = Facts()
    dumps = json_text
    for span in decoded.spans:
        attributes = span.attributes
        # Gaps are counted per seq origin, so every row says which origin it came from.
        span.instance_id = seq_origin(span, attributes)
        facts.points_before, facts.failures_before = len(facts.points), len(facts.failures)
        facts.spans.append(_span_row(span, attributes, dumps, received_ns))
        _note_seq(facts, span, attributes)
        _by_name(facts, span, attributes)
        if span.events:
            _events(facts, span, attributes)
    if facts.requests and facts.request_stubs:
        # A request whose own span is in this batch needs no 'running' stub first.
        finished = {(row["trace_id"], row["span_id"]) for row in facts.requests}
        facts.request_stubs = [
            stub
            for stub in facts.request_stubs
            if (stub["trace_id"], stub["span_id"]) not in finished
        ]
    return facts


SPAN_COLUMNS = (
    "trace_id",
    "span_id",
    "parent_span_id",
    "name",
    "kind",
    "start_ns",
    "end_ns",
    "status_code",
    "status_message",
    "service_name",
    "instance_id",
    "seq",
    "engine_id",
    "request_id",
    "attributes",
    "events",
    "links",
    "received_ns",
)
"""The span table's columns in the order of the row tuples below."""


def _span_row(span: SpanRecord, attributes: dict, dumps, received_ns: int) -> tuple:
    seq = attributes.get(names.SEQ)
    request_id = attributes.get(names.REQUEST_ID)
    return (
        span.trace_id,
        span.span_id,
        span.parent_span_id,
        span.name,
        span.kind,
        span.start_ns,
        span.end_ns,
        span.status_code,
        span.status_message,
        span.service_name,
        span.instance_id,
        seq if type(seq) is int else None,
        span.engine_id,
        None if request_id is None else _str(request_id),
        dumps(attributes),
        dumps(span.events) if span.events else "[]",
        dumps(span.links) if span.links else "[]",
        received_ns,
    )


def _str(value) -> str | None:
    if type(value) is str and "\x00" not in value:
        return value  # the usual case, without a call
    return None if value is None else clean(str(value))


def seq_origin(span: SpanRecord, attributes: dict) -> str | None:
    """The process start that numbered the span: kvscope's own origin, else the resource's."""
    return _str(attributes.get(names.SEQ_ORIGIN)) or span.instance_id


def _note_seq(facts: Facts, span: SpanRecord, attributes: dict) -> None:
    seq = attributes.get(names.SEQ)
    origin = span.instance_id
    if origin:
        known = facts.origins.get(origin)
        if known is None or (known[2] is None and names.KV_ROLE in attributes):
            role = _str(attributes.get(names.KV_ROLE))
            facts.origins[origin] = (span.service_name, span.engine_id, role)
        if type(seq) is int:  # not a bool, which Python counts as an int
            facts.seqs.setdefault(origin, []).append((seq, span.start_ns))


def _by_name(facts: Facts, span: SpanRecord, attributes: dict) -> None:
    name = span.name
    if name == names.SPAN_REQUEST:
        facts.requests.append(_request_row(span, attributes))
    elif name.startswith(names.SPAN_HOOK_PREFIX):
        _hook(facts, span, attributes)
    elif name == names.SPAN_TRANSFER:
        _transfer(facts, span, attributes)
    elif name == names.SPAN_REQUEST_EVENT:
        point = attributes.get(names.TIMELINE_POINT)
        has_event = any(e["name"] == names.EVENT_TIMELINE for e in span.events)
        if point and not has_event:
            _point(facts, span, attributes, str(point), span.start_ns)
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


def _request_row(span: SpanRecord, attributes: dict) -> dict:
    status = _str(attributes.get(REQUEST_STATUS))
    if status is None:
        status = "error" if span.status_code == _STATUS_ERROR else "finished"
    prompt_tokens = attributes.get(names.PROMPT_TOKENS)
    return {
        "trace_id": span.trace_id,
        "span_id": span.span_id,
        "request_id": _str(attributes.get(names.REQUEST_ID)),
        "engine_id": span.engine_id,
        "connector": _str(attributes.get(names.CONNECTOR_NAME)),
        "kv_role": _str(attributes.get(names.KV_ROLE)),
        "instance_id": span.instance_id,
        "start_ns": span.start_ns,
        "end_ns": span.end_ns,
        "status": status.lower(),
        "status_message": span.status_message,
        "prompt_tokens": prompt_tokens if isinstance(prompt_tokens, int) else None,
    }


def _hook(facts: Facts, span: SpanRecord, attributes: dict) -> None:
    name = span.name
    request_id = attributes.get(names.REQUEST_ID)
    is_scheduler = attributes.get(names.CONNECTOR_ROLE) != "worker"
    # A composite's child hook is the child of the composite's hook span, not of the request.
    of_request = span.parent_span_id and names.CONNECTOR_CHILD not in attributes
    if request_id is not None and of_request and is_scheduler:
        # A hook seen before its request span ended: the request is running.
        key = (span.trace_id, span.parent_span_id)
        if key not in facts.stub_keys:
            facts.stub_keys.add(key)
            stub = _request_row(span, attributes)
            stub.update(
                span_id=span.parent_span_id, end_ns=None, status="running", status_message=None
            )
            facts.request_stubs.append(stub)
    if name == _LOOKUP_HOOK:
        hit = attributes.get(names.TOKENS_EXTERNAL_HIT)
        lookup = measures.lookup_row(span, attributes)
        if lookup is not None:
            facts.lookups.append(lookup)
        _point(facts, span, attributes, "lookup_start", span.start_ns)
        _point(
            facts,
            span,
            attributes,
            "lookup_result",
            span.end_ns,
            value=hit if isinstance(hit, int) else None,
        )
    elif name == _ALLOC_HOOK:
        to_load = attributes.get(names.TOKENS_TO_LOAD)
        if isinstance(to_load, int) and to_load > 0:
            _point(facts, span, attributes, "blocks_allocated", span.end_ns, value=to_load)
    elif name in _FINISH_HOOKS:
        _point(facts, span, attributes, "finished", span.end_ns)


def _point(facts, span, attributes, point, time_ns, value=None, layer=None, request_id=None):
    facts.points.append(
        {
            "trace_id": span.trace_id,
            "span_id": span.span_id,
            "ordinal": len(facts.points) - facts.points_before,
            "engine_id": span.engine_id,
            "request_id": request_id or _str(attributes.get(names.REQUEST_ID)),
            "point": point,
            "time_ns": time_ns,
            "value": value,
            "layer": layer,
        }
    )


def _transfer(facts: Facts, span: SpanRecord, attributes: dict) -> None:
    size = attributes.get(names.TRANSFER_BYTES)
    duration_ms = attributes.get(names.TRANSFER_DURATION_MS)
    if not isinstance(duration_ms, int | float):
        duration_ms = (span.end_ns - span.start_ns) / 1e6
    gbps = attributes.get(names.TRANSFER_GBPS)
    if not isinstance(gbps, int | float) and isinstance(size, int) and duration_ms > 0:
        gbps = size / (duration_ms * 1e6)
    ok = attributes.get(names.TRANSFER_OK)
    ok = (ok is not False) and span.status_code != _STATUS_ERROR
    descriptors = attributes.get(names.TRANSFER_DESCRIPTORS)
    facts.transfers.append(
        {
            "trace_id": span.trace_id,
            "span_id": span.span_id,
            "request_id": _str(attributes.get(names.REQUEST_ID)),
            "engine_id": span.engine_id,
            "direction": _str(attributes.get(names.TRANSFER_DIRECTION)),
            "peer": _str(attributes.get(names.TRANSFER_PEER)),
            "bytes": size if isinstance(size, int) else None,
            "duration_ms": float(duration_ms),
            "gbps": float(gbps) if isinstance(gbps, int | float) else None,
            "descriptors": descriptors if isinstance(descriptors, int) else None,
            "ok": ok,
            "start_ns": span.start_ns,
            "end_ns": span.end_ns,
        }
    )
    if not ok:
        facts.failures.append(
            state_events.failure_row(facts, span, attributes, {}, span.end_ns, "transfer_failed")
        )


def _events(facts: Facts, span: SpanRecord, attributes: dict) -> None:
    for event in span.events:
        event_name = event["name"]
        event_attributes = event["attributes"]
        if event_name == names.EVENT_TIMELINE:
            point = event_attributes.get(names.TIMELINE_POINT)
            if point:
                layer = event_attributes.get(names.LAYER_INDEX)
                _point(
                    facts,
                    span,
                    attributes,
                    str(point),
                    event["time_ns"],
                    layer=layer if isinstance(layer, int) else None,
                    request_id=_str(event_attributes.get(names.REQUEST_ID)),
                )
        else:
            state_events.apply(facts, span, attributes, event)
