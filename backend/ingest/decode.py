"""OTLP/HTTP trace payloads: decode protobuf or JSON into flat span records, encode responses."""

import base64
import json
import math

from google.protobuf import json_format
from google.protobuf.message import DecodeError
from google.rpc import status_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as pb

from kvscope.backend.ingest import text
from kvscope.backend.ingest.body import PROTOBUF
from kvscope.backend.ingest.bound import MAX_NS, Limits, SpanChecker, invalid_reason
from kvscope.backend.ingest.record import SERVICE_NAME, Decoded, SpanRecord, clean
from kvscope.traces import names


class PayloadError(ValueError):
    """The body is not an OTLP trace export request; the message says what to fix."""


_PLAIN = frozenset(("string_value", "int_value", "bool_value"))


def any_value(value) -> object:
    """An AnyValue as a plain Python value (bytes as hex, so it stays JSON-friendly)."""
    kind = value.WhichOneof("value")
    if kind == "string_value":
        return text.safe(value.string_value)
    if kind in _PLAIN:
        return getattr(value, kind)
    if kind == "double_value":
        number = value.double_value
        # NaN and infinities are not JSON: keep them readable as text instead of failing reads.
        return number if math.isfinite(number) else str(number)
    if kind == "array_value":
        return _array(value.array_value.values)
    if kind == "kvlist_value":
        return {kv.key: any_value(kv.value) for kv in value.kvlist_value.values}
    if kind == "bytes_value":
        return value.bytes_value.hex()
    return None


def attributes_of(key_values) -> dict:
    attributes = {}
    for kv in key_values:
        value = kv.value
        # Inlined common cases: this loop runs for every attribute of every span. Reading
        # string_value first spares the oneof lookup for the usual attribute, a text.
        item = value.string_value
        if item:
            attributes[kv.key] = item if "\x00" not in item else text.safe(item)
            continue
        kind = value.WhichOneof("value")
        if kind == "int_value":
            attributes[kv.key] = value.int_value
        elif kind == "array_value":
            attributes[kv.key] = _array(value.array_value.values)
        else:
            attributes[kv.key] = getattr(value, kind) if kind in _PLAIN else any_value(value)
    return attributes


def _array(values) -> list:
    """An array value's items (block ids, most often: integers, read without a call each)."""
    return [
        item.int_value if item.WhichOneof("value") == "int_value" else any_value(item)
        for item in values
    ]


def parse_body(body: bytes, content_type: str) -> pb.ExportTraceServiceRequest:
    """Parse the (already decompressed) body in the encoding its content type names."""
    text.parsed(0)
    request = _parse_protobuf(body) if content_type == PROTOBUF else _parse_json(body)
    if body and not request.resource_spans:
        raise PayloadError(
            "body decoded to an ExportTraceServiceRequest with no resourceSpans: "
            "send an OTLP trace export request (did you post logs or metrics here?)"
        )
    return request


def _parse_protobuf(body: bytes) -> pb.ExportTraceServiceRequest:
    try:
        return pb.ExportTraceServiceRequest.FromString(body)
    except DecodeError as error:
        if "UTF-8" not in str(error):
            raise PayloadError(f"body is not a valid OTLP protobuf message: {error}") from None
    try:  # a string field that is not UTF-8: replaced, not a reason to lose the batch
        repaired, repairs = text.repaired_protobuf(body)
        request = pb.ExportTraceServiceRequest.FromString(repaired)
    except DecodeError as error:
        raise PayloadError(f"body is not a valid OTLP protobuf message: {error}") from None
    text.parsed(repairs)
    return request


def _parse_json(body: bytes) -> pb.ExportTraceServiceRequest:
    try:
        document = json.loads(text.utf8(body))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise PayloadError(f"body is not valid JSON: {error}") from None
    except RecursionError:
        raise PayloadError("body is JSON nested too deeply for an OTLP request") from None
    if not isinstance(document, dict):
        raise PayloadError("OTLP JSON body must be an object with a resourceSpans list")
    _hex_ids_to_base64(document)
    try:
        return json_format.ParseDict(
            document, pb.ExportTraceServiceRequest(), ignore_unknown_fields=True
        )
    except (json_format.ParseError, TypeError, ValueError, RecursionError) as error:
        raise PayloadError(f"body is not an OTLP JSON trace export request: {error}") from None
    except SystemError:
        # upb raises this when a name or value holds a lone UTF-16 surrogate ("\ud800"), which
        # JSON's escapes allow and UTF-8 cannot carry.
        raise PayloadError("body has text that is not valid Unicode (a lone surrogate)") from None


def _pick(obj: dict, camel: str, snake: str) -> list:
    found = obj.get(camel, obj.get(snake))
    return found if isinstance(found, list) else []


def _hex_ids_to_base64(document: dict) -> None:
    """OTLP JSON writes ids in hex where protobuf's JSON mapping expects base64 bytes."""
    for resource_spans in _pick(document, "resourceSpans", "resource_spans"):
        if not isinstance(resource_spans, dict):
            continue
        for scope_spans in _pick(resource_spans, "scopeSpans", "scope_spans"):
            if not isinstance(scope_spans, dict):
                continue
            for span in _pick(scope_spans, "spans", "spans"):
                if not isinstance(span, dict):
                    continue
                _convert_ids(
                    span,
                    ("traceId", "trace_id", "spanId", "span_id", "parentSpanId", "parent_span_id"),
                )
                for link in _pick(span, "links", "links"):
                    if isinstance(link, dict):
                        _convert_ids(link, ("traceId", "trace_id", "spanId", "span_id"))


def _convert_ids(obj: dict, keys: tuple[str, ...]) -> None:
    for key in keys:
        hex_id = obj.get(key)
        if isinstance(hex_id, str):
            try:
                obj[key] = base64.b64encode(bytes.fromhex(hex_id)).decode()
            except ValueError:
                obj[key] = ""  # an unreadable id rejects this span only, with a reason


def decode(request: pb.ExportTraceServiceRequest, limits: Limits) -> Decoded:
    """Flatten the request into span records; invalid spans are counted, not fatal."""
    decoded = Decoded()
    checker = SpanChecker(limits)
    replaced_before = text.replaced()
    for resource_spans in request.resource_spans:
        resource = attributes_of(resource_spans.resource.attributes)
        instance_id = _text(resource.get(names.PROCESS_ID))
        service_name = _text(resource.get(SERVICE_NAME))
        engine_id = _text(resource.get(names.ENGINE_ID))
        if instance_id:
            decoded.resources[instance_id] = resource
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                record = _record(span, checker, instance_id, service_name, engine_id)
                if record is None:
                    decoded.rejected += 1
                else:
                    decoded.spans.append(record)
    if replaced := text.replaced() - replaced_before + text.take_parsed():
        checker.note(REPLACED_TEXT, f"{replaced} string(s) in all")
    decoded.message = checker.summary()
    return decoded


REPLACED_TEXT = "text with NUL characters or invalid UTF-8 stored with U+FFFD in their place"


def _text(value: object) -> str | None:
    return None if value is None else clean(str(value))


def _record(span, checker: SpanChecker, instance_id, service_name, engine_id):
    # Every field is read once: each read of a protobuf field builds a new Python object.
    trace_id, span_id, parent_span_id = span.trace_id, span.span_id, span.parent_span_id
    name, start_ns, end_ns = span.name, span.start_time_unix_nano, span.end_time_unix_nano
    reason = invalid_reason(trace_id, span_id, parent_span_id, name, start_ns, end_ns)
    if reason:
        checker.note(reason)
        return None
    events, links = span.events, span.links
    attributes = checker.bounded(attributes_of(span.attributes), name)
    if events and len(events) > checker.limits.max_events_per_span:
        events = checker.bounded_events(span)
    status = span.status
    status_message = status.message
    engine = attributes.get(names.ENGINE_ID)
    # Positional, in SpanRecord's field order: keywords cost about half a microsecond a span.
    return SpanRecord(
        trace_id.hex(),  # trace_id
        span_id.hex(),  # span_id
        parent_span_id.hex() or None,  # parent_span_id
        clean(name),  # name
        span.kind,  # kind
        start_ns,  # start_ns
        end_ns,  # end_ns
        status.code,  # status_code
        clean(status_message) if status_message else None,  # status_message
        attributes,  # attributes
        _events(events, checker, name) if events else [],  # events
        [_link(link, checker, name) for link in links] if links else [],  # links
        instance_id,  # instance_id
        service_name,  # service_name
        engine_id if engine is None else (_text(engine) or engine_id),  # engine_id
    )


def _events(events, checker: SpanChecker, span_name: str) -> list[dict]:
    kept = []
    for event in events:
        time_ns = event.time_unix_nano
        if time_ns >= MAX_NS:  # times are stored as signed 64-bit integers
            checker.note("events dated beyond the year 2262 dropped", f"first on {span_name!r}")
            continue
        kept.append(
            {
                "name": clean(event.name),
                "time_ns": time_ns,
                "attributes": checker.bounded(attributes_of(event.attributes), span_name),
            }
        )
    return kept


def _link(link, checker: SpanChecker, span_name: str) -> dict:
    return {
        "trace_id": link.trace_id.hex(),
        "span_id": link.span_id.hex(),
        "attributes": checker.bounded(attributes_of(link.attributes), span_name),
    }


def encode_response(content_type: str, rejected: int, message: str | None) -> bytes:
    """ExportTraceServiceResponse in the request's encoding; partial_success only if needed."""
    response = pb.ExportTraceServiceResponse()
    if rejected or message:
        response.partial_success.rejected_spans = rejected
        response.partial_success.error_message = message or ""
    if content_type == PROTOBUF:
        return response.SerializeToString()
    return json.dumps(json_format.MessageToDict(response)).encode()


def encode_status(content_type: str, code: int, message: str) -> bytes:
    """A google.rpc.Status error body, as OTLP/HTTP asks for failed requests."""
    if content_type == PROTOBUF:
        return status_pb2.Status(code=code, message=message).SerializeToString()
    return json.dumps({"code": code, "message": message}).encode()
