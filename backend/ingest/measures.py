"""Rows of the lookup and latency tables: the numbers the summary and series add up in SQL."""

from kvscope.backend.ingest.record import SpanRecord, clean
from kvscope.traces import names

TTFT_S = "gen_ai.latency.time_to_first_token"
QUEUE_S = "gen_ai.latency.time_in_queue"


def _str(value) -> str | None:
    return None if value is None else clean(str(value))


def _ms(value) -> float | None:
    return float(value) * 1e3 if isinstance(value, int | float) and value >= 0 else None


def lookup_row(span: SpanRecord, attributes: dict) -> dict | None:
    """A decided lookup; None while the connector is still deciding (hit not an int)."""
    hit = attributes.get(names.TOKENS_EXTERNAL_HIT)
    if type(hit) is not int:
        return None
    return {
        "trace_id": span.trace_id,
        "span_id": span.span_id,
        "engine_id": span.engine_id,
        "request_id": _str(attributes.get(names.REQUEST_ID)),
        "connector": _str(attributes.get(names.CONNECTOR_NAME)),
        "child": _str(attributes.get(names.CONNECTOR_CHILD)),
        "time_ns": span.end_ns,
        "hit_tokens": hit,
        "local_hit_tokens": _int(attributes.get(names.TOKENS_LOCAL_HIT)),
    }


def _int(value) -> int | None:
    return value if type(value) is int else None


def latency_row(span: SpanRecord, attributes: dict) -> dict:
    """vLLM's llm_request span: time to first token and time in queue, in ms."""
    return {
        "trace_id": span.trace_id,
        "span_id": span.span_id,
        "request_id": _str(attributes.get(names.REQUEST_ID)),
        "time_ns": span.start_ns,
        "ttft_ms": _ms(attributes.get(TTFT_S)),
        "queue_ms": _ms(attributes.get(QUEUE_S)),
    }
