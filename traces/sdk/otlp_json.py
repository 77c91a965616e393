"""Encodes SDK spans as OTLP/JSON (an ExportTraceServiceRequest), as OTLP/HTTP JSON sends it."""

import base64
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
