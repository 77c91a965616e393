"""Encodes SDK spans as OTLP/JSON (an ExportTraceServiceRequest), as OTLP/HTTP JSON sends it."""

import base64
import fcntl
import json
from collections.abc import Sequence

from google.protobuf.json_format import MessageToDict
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import ReadableSpan

_ID_KEYS = ("traceId", "spanId", "parentSpanId")


def spans_to_otlp_json(spans: Sequence[ReadableSpan]) -> str:
    """One ExportTraceServiceRequest in OTLP/JSON: hex ids, camelCase keys, enums as integers."""
    message = MessageToDict(encode_spans(spans), use_integers_for_enums=True)
    for resource_spans in message.get("resourceSpans", ()):
        for scope_spans in resource_spans.get("scopeSpans", ()):
            for span in scope_spans.get("spans", ()):
                _hex_ids(span)
                for link in span.get("links", ()):
                    _hex_ids(link)
    return json.dumps(message, separators=(",", ":"))


def _hex_ids(obj: dict) -> None:
    # Protobuf's JSON mapping writes bytes as base64; OTLP/JSON requires hex trace and span ids.
    for key in _ID_KEYS:
        if obj.get(key):
            obj[key] = base64.b64decode(obj[key]).hex()


def flat_spans(request: dict) -> list[dict]:
    """The spans of one OTLP/JSON request as flat dicts: name, ids, times, attributes, resource."""
    out = []
    for resource_spans in request.get("resourceSpans", ()):
        resource = _attributes(resource_spans.get("resource", {}).get("attributes", ()))
        for scope_spans in resource_spans.get("scopeSpans", ()):
            for span in scope_spans.get("spans", ()):
                out.append(
                    {
                        "name": span["name"],
                        "trace_id": span["traceId"],
                        "span_id": span["spanId"],
                        "parent_span_id": span.get("parentSpanId", ""),
                        "start_ns": int(span["startTimeUnixNano"]),
                        "end_ns": int(span["endTimeUnixNano"]),
                        "attributes": _attributes(span.get("attributes", ())),
                        "events": [
                            {"name": e["name"], **_attributes(e.get("attributes", ()))}
                            for e in span.get("events", ())
                        ],
                        "links": [
                            {"trace_id": link["traceId"], "span_id": link["spanId"]}
                            for link in span.get("links", ())
                        ],
                        "resource": resource,
                    }
                )
    return out


def read_spans_file(path: str) -> list[dict]:
    """Every span in a file of OTLP/JSON lines (as OtlpJsonFileExporter writes), read under a
    shared lock: the exporter writes each line under an exclusive one, so a line another
    process is writing is never read half-written."""
    with open(path, encoding="utf-8") as lines:
        fcntl.flock(lines, fcntl.LOCK_SH)
        return [span for line in lines if line.strip() for span in flat_spans(json.loads(line))]


def _attributes(pairs) -> dict:
    return {pair["key"]: _value(pair.get("value", {})) for pair in pairs}


def _value(value: dict):
    if "arrayValue" in value:
        return [_value(v) for v in value["arrayValue"].get("values", ())]
    for key, cast in (
        ("stringValue", str),
        ("boolValue", bool),
        ("intValue", int),
        ("doubleValue", float),
    ):
        if key in value:
            return cast(value[key])
    return None
