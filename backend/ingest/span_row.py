"""The span table's row for one span (SPAN_COLUMNS order), its JSON text, and column_text()."""

import json

# typeshed omits json.encoder.c_make_encoder (the C encoder, None where it is not built).
from json.encoder import c_make_encoder, encode_basestring_ascii  # type: ignore[attr-defined]

import msgspec

from kvscope.backend.ingest.record import SpanRecord, clean
from kvscope.traces import names


def _standard_json_text():
    """The standard library's C encoder, built once; decoded OTLP values are trees (no
    cycles), so the circular-reference check is off."""
    if c_make_encoder is None:  # a Python without the C accelerator
        return json.JSONEncoder(separators=(",", ":"), default=str).encode
    encoder = c_make_encoder(None, str, encode_basestring_ascii, None, ":", ",", False, False, True)
    return lambda value: "".join(encoder(value, 0))


_standard = _standard_json_text()
_encode = msgspec.json.Encoder(enc_hook=str).encode


def json_text(value) -> str:
    """Compact JSON text of an attribute tree (non-ASCII text as UTF-8, not escaped).

    msgspec's encoder takes a third of the standard library's time on span attributes (0.48
    against 1.27 us a span); what it refuses (a lone surrogate from a JSON body) goes through
    the standard one.
    """
    try:
        return _encode(value).decode()
    except (TypeError, ValueError, OverflowError):
        return _standard(value)


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
"""The span table's columns in the order of span_row's tuples."""


def span_row(span: SpanRecord, attributes: dict, dumps, received_ns: int) -> tuple:
    """One span as the span table stores it; dumps turns attribute trees into JSON text."""
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
        None if request_id is None else column_text(request_id),
        dumps(attributes),
        dumps(span.events) if span.events else "[]",
        dumps(span.links) if span.links else "[]",
        received_ns,
    )


def column_text(value) -> str | None:
    """An attribute value as a text column holds it: None stays None, NUL is replaced."""
    if type(value) is str and "\x00" not in value:
        return value  # the usual case, without a call
    return None if value is None else clean(str(value))
