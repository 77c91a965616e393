"""Encodes SDK spans as an OTLP ExportTraceServiceRequest in protobuf bytes, written directly.

The SDK's encoder builds a protobuf object per span, attribute and value; that costs several
times what creating the span did, on the export thread, holding the GIL the engine needs. This
writes the same message straight to the wire format, and keeps the encoded bytes of recurring
string attributes (connector name, role, hook, engine id...). A test checks that the
bytes parse into the message the SDK's encoder builds.
"""

import struct
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan

_MASK64 = (1 << 64) - 1
_SMALL = [bytes([n]) if n < 128 else bytes([(n & 0x7F) | 0x80, n >> 7]) for n in range(16384)]
_FIXED64 = struct.Struct("<Q").pack
_FIXED32 = struct.Struct("<I").pack
_DOUBLE = struct.Struct("<d").pack
_HAS_IS_REMOTE, _IS_REMOTE = 0x100, 0x200  # SpanFlags in the OTLP proto

_cache: dict[tuple[bytes, str, str], bytes] = {}
_CACHE_LIMIT = 8192


def _varint(n: int) -> bytes:
    if n < 16384:
        return _SMALL[n]
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field: tag, length, payload."""
    return tag + _varint(len(payload)) + payload


def _any_value(value: Any) -> bytes:
    """An AnyValue message (its fields, without an enclosing tag)."""
    if isinstance(value, bool):
        return b"\x10\x01" if value else b"\x10\x00"
    if isinstance(value, str):
        return _field(b"\x0a", value.encode("utf-8", "surrogatepass"))
    if isinstance(value, int):
        return b"\x18" + _varint(value & _MASK64)
    if isinstance(value, float):
        return b"\x21" + _DOUBLE(value)
    if isinstance(value, bytes):
        return _field(b"\x3a", value)
    if value is None:
        return b""
    if isinstance(value, Sequence):
        return _field(b"\x2a", b"".join(_field(b"\x0a", _any_value(v)) for v in value))
    if isinstance(value, Mapping):
        pairs = b"".join(_field(b"\x0a", _key_value(str(k), v)) for k, v in value.items())
        return _field(b"\x32", pairs)
    raise TypeError(f"attribute value of type {type(value).__name__} cannot be encoded")


def _key_value(key: str, value: Any) -> bytes:
    """A KeyValue message (its fields)."""
    return _field(b"\x0a", key.encode("utf-8", "surrogatepass")) + _field(
        b"\x12", _any_value(value)
    )


def _attributes(tag: bytes, attributes: Mapping[str, Any] | None) -> list[bytes]:
    """KeyValue fields under `tag`; those with a string value are kept once encoded."""
    if not attributes:
        return []
    # The SDK's BoundedAttributes iterates through Python-level methods; its dict does not.
    items = getattr(attributes, "_dict", attributes)
    out = []
    for key, value in items.items():
        if type(value) is str:
            encoded = _cache.get((tag, key, value))
            if encoded is None:
                if len(_cache) >= _CACHE_LIMIT:
                    _cache.clear()
                encoded = _cache[(tag, key, value)] = _field(tag, _key_value(key, value))
        else:
            encoded = _field(tag, _key_value(key, value))
        out.append(encoded)
    return out


def _flags(context: Any) -> bytes:
    return _FIXED32(_HAS_IS_REMOTE | (_IS_REMOTE if context and context.is_remote else 0))


def _trace_state(trace_state: Any) -> str:
    return ",".join(f"{k}={v}" for k, v in trace_state.items()) if trace_state else ""


def _event(event: Any) -> bytes:
    parts = [b"\x09" + _FIXED64(event.timestamp), _field(b"\x12", event.name.encode())]
    parts += _attributes(b"\x1a", event.attributes)
    if event.dropped_attributes:
        parts.append(b"\x20" + _varint(event.dropped_attributes))
    return _field(b"\x5a", b"".join(parts))


def _link(link: Any) -> bytes:
    context = link.context
    parts = [
        b"\x0a\x10" + context.trace_id.to_bytes(16, "big"),
        b"\x12\x08" + context.span_id.to_bytes(8, "big"),
    ]
    if state := _trace_state(context.trace_state):
        parts.append(_field(b"\x1a", state.encode()))
    parts += _attributes(b"\x22", link.attributes)
    if link.dropped_attributes:
        parts.append(b"\x28" + _varint(link.dropped_attributes))
    parts.append(b"\x35" + _flags(context))
    return _field(b"\x6a", b"".join(parts))


def encode_span(span: ReadableSpan) -> bytes:
    """One Span message (its fields, without an enclosing tag)."""
    context = span.context
    parent = span.parent
    parts = [
        b"\x0a\x10" + context.trace_id.to_bytes(16, "big"),
        b"\x12\x08" + context.span_id.to_bytes(8, "big"),
    ]
    if state := _trace_state(context.trace_state):
        parts.append(_field(b"\x1a", state.encode()))
    if parent is not None:
        parts.append(b"\x22\x08" + parent.span_id.to_bytes(8, "big"))
    parts.append(_field(b"\x2a", span.name.encode("utf-8", "surrogatepass")))
    parts.append(b"\x30" + _varint(span.kind.value + 1))  # the proto's kinds start at 1
    parts.append(b"\x39" + _FIXED64(span.start_time or 0))
    parts.append(b"\x41" + _FIXED64(span.end_time or 0))
    # ReadableSpan.attributes wraps the BoundedAttributes in a MappingProxyType, which hides
    # the dict _attributes() reads; the SDK's own exporters read the attributes it wraps too.
    parts += _attributes(b"\x4a", getattr(span, "_attributes", None) or span.attributes)
    if span.dropped_attributes:
        parts.append(b"\x50" + _varint(span.dropped_attributes))
    parts += [_event(event) for event in span.events]
    if span.dropped_events:
        parts.append(b"\x60" + _varint(span.dropped_events))
    parts += [_link(link) for link in span.links]
    if span.dropped_links:
        parts.append(b"\x70" + _varint(span.dropped_links))
    status = span.status
    status_fields = b""
    if status.description:
        status_fields += _field(b"\x12", status.description.encode("utf-8", "surrogatepass"))
    if status.status_code.value:
        status_fields += b"\x18" + _varint(status.status_code.value)
    parts.append(_field(b"\x7a", status_fields))
    parts.append(b"\x85\x01" + _flags(parent))
    return b"".join(parts)


def _resource(resource: Any) -> bytes:
    return b"".join(_attributes(b"\x0a", resource.attributes))


def _scope(scope: Any) -> bytes:
    if scope is None:
        return b""
    parts = [_field(b"\x0a", scope.name.encode())] if scope.name else []
    if scope.version:
        parts.append(_field(b"\x12", scope.version.encode()))
    parts += _attributes(b"\x1a", scope.attributes)
    return b"".join(parts)


def encode_spans(spans: Sequence[ReadableSpan]) -> bytes:
    """An ExportTraceServiceRequest with the spans grouped by resource, then by scope."""
    # Keyed by identity: a Resource hashes by serialising its attributes to JSON, and the spans
    # of one provider share one Resource object.
    resources: dict[int, Any] = {}
    grouped: dict[int, dict[Any, list[bytes]]] = {}
    for span in spans:
        resource = span.resource
        if (scopes := grouped.get(id(resource))) is None:
            resources[id(resource)] = resource
            scopes = grouped[id(resource)] = {}
        scopes.setdefault(span.instrumentation_scope, []).append(_field(b"\x12", encode_span(span)))
    request = []
    for key, scopes in grouped.items():
        resource = resources[key]
        parts = [_field(b"\x0a", _resource(resource))]
        for scope, encoded in scopes.items():
            scope_parts = [_field(b"\x0a", _scope(scope)), *encoded]
            if scope is not None and scope.schema_url:
                scope_parts.append(_field(b"\x1a", scope.schema_url.encode()))
            parts.append(_field(b"\x12", b"".join(scope_parts)))
        if resource.schema_url:
            parts.append(_field(b"\x1a", resource.schema_url.encode()))
        request.append(_field(b"\x0a", b"".join(parts)))
    return b"".join(request)
