"""Rows of a request's tables from its spans: the request, its timeline points, its transfers."""

from kvscope.backend.ingest import measures, state_events
from kvscope.backend.ingest.facts import Facts
from kvscope.backend.ingest.record import SpanRecord
from kvscope.backend.ingest.span_row import column_text
from kvscope.traces import names

_LOOKUP_HOOK = names.SPAN_HOOK_PREFIX + "get_num_new_matched_tokens"
_ALLOC_HOOK = names.SPAN_HOOK_PREFIX + "update_state_after_alloc"
_FINISH_HOOKS = {
    names.SPAN_HOOK_PREFIX + "request_finished",
    names.SPAN_HOOK_PREFIX + "request_finished_all_groups",
}
_VLLM_CACHED = {
    names.TOKENS_VLLM_LOCAL_CACHED: "vllm_local_cached",
    names.TOKENS_VLLM_EXTERNAL_CACHED: "vllm_external_cached",
}
"""vLLM's own count of a request's cached tokens, as timeline points (token accounting)."""
STATUS_ERROR = 2
"""OTLP's STATUS_CODE_ERROR."""

POINT_COLUMNS = (
    "trace_id",
    "span_id",
    "ordinal",
    "engine_id",
    "request_id",
    "point",
    "time_ns",
    "value",
    "layer",
)
"""The timeline point table's columns in the order of timeline_point's tuples (a tuple, not a
dict: a batch has more points than spans, and each crosses from an ingest worker marshalled)."""


def request_row(span: SpanRecord, attributes: dict) -> dict:
    """The request table's row of a request span (or, from a hook span, of its request)."""
    status = column_text(attributes.get(names.REQUEST_STATUS))
    if status is None:
        status = "error" if span.status_code == STATUS_ERROR else "finished"
    prompt_tokens = attributes.get(names.PROMPT_TOKENS)
    return {
        "trace_id": span.trace_id,
        "span_id": span.span_id,
        "request_id": column_text(attributes.get(names.REQUEST_ID)),
        "engine_id": span.engine_id,
        "connector": column_text(attributes.get(names.CONNECTOR_NAME)),
        "kv_role": column_text(attributes.get(names.KV_ROLE)),
        "instance_id": span.instance_id,
        "start_ns": span.start_ns,
        "end_ns": span.end_ns,
        "status": status.lower(),
        "status_message": span.status_message,
        "prompt_tokens": prompt_tokens if isinstance(prompt_tokens, int) else None,
    }


def hook(facts: Facts, span: SpanRecord, attributes: dict) -> None:
    """A hook span's rows: a 'running' stub of its request, a lookup, timeline points."""
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
            stub = request_row(span, attributes)
            stub.update(
                span_id=span.parent_span_id, end_ns=None, status="running", status_message=None
            )
            facts.request_stubs.append(stub)
    if name == _LOOKUP_HOOK:
        hit = attributes.get(names.TOKENS_EXTERNAL_HIT)
        lookup = measures.lookup_row(span, attributes)
        if lookup is not None:
            facts.lookups.append(lookup)
        timeline_point(facts, span, attributes, "lookup_start", span.start_ns)
        timeline_point(
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
            timeline_point(facts, span, attributes, "blocks_allocated", span.end_ns, value=to_load)
        for attribute, point in _VLLM_CACHED.items():
            if type(attributes.get(attribute)) is int:
                timeline_point(facts, span, attributes, point, span.end_ns, attributes[attribute])
    elif name in _FINISH_HOOKS:
        timeline_point(facts, span, attributes, "finished", span.end_ns)


def timeline_point(
    facts, span, attributes, point, time_ns, value=None, layer=None, request_id=None
):
    """One timeline point of the span's request; ordinals count within the span."""
    facts.points.append(
        (
            span.trace_id,
            span.span_id,
            len(facts.points) - facts.points_before,  # ordinal
            span.engine_id,
            request_id or column_text(attributes.get(names.REQUEST_ID)),
            point,
            time_ns,
            value,
            layer,
        )
    )


def transfer(facts: Facts, span: SpanRecord, attributes: dict) -> None:
    """A transfer span's row (GB/s derived when the span has none); a failure if it failed."""
    size = attributes.get(names.TRANSFER_BYTES)
    duration_ms = attributes.get(names.TRANSFER_DURATION_MS)
    if not isinstance(duration_ms, int | float):
        duration_ms = (span.end_ns - span.start_ns) / 1e6
    gbps = attributes.get(names.TRANSFER_GBPS)
    if not isinstance(gbps, int | float) and isinstance(size, int) and duration_ms > 0:
        gbps = size / (duration_ms * 1e6)
    ok = attributes.get(names.TRANSFER_OK)
    ok = (ok is not False) and span.status_code != STATUS_ERROR
    descriptors = attributes.get(names.TRANSFER_DESCRIPTORS)
    facts.transfers.append(
        {
            "trace_id": span.trace_id,
            "span_id": span.span_id,
            "request_id": column_text(attributes.get(names.REQUEST_ID)),
            "engine_id": span.engine_id,
            "direction": column_text(attributes.get(names.TRANSFER_DIRECTION)),
            "peer": column_text(attributes.get(names.TRANSFER_PEER)),
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
