"""The direct OTLP protobuf encoder writes the message the SDK's own encoder builds."""

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans as sdk_encode
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceState

from kvscope.traces.sdk.otlp_proto import encode_spans

ODD_VALUES = {
    "str": "préfixe ✓",
    "empty": "",
    "true": True,
    "false": False,
    "zero": 0,
    "negative": -5,
    "big": 2**63 - 1,
    "small_negative": -(2**63),
    "float": 1.5,
    "nan_free_negative_float": -0.25,
    "ints": [1, 2, 300000],
    "strs": ["a", "", "ü"],
    "bools": [True, False],
    "floats": [0.5, 2.0],
    "empty_list": [],
}


def _spans():
    exporter = InMemorySpanExporter()
    providers = [
        TracerProvider(resource=Resource.create({"service.name": name, "n": i}))
        for i, name in enumerate(("kvscope-a", "kvscope-b"))
    ]
    for provider in providers:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracers = [
        providers[0].get_tracer("kvscope", "1.0"),
        providers[0].get_tracer("other", schema_url="https://opentelemetry.io/schemas/1.21.0"),
        providers[1].get_tracer("kvscope"),
    ]
    remote = SpanContext(
        trace_id=0x0AF7651916CD43DD8448EB211C80319C,
        span_id=0xB7AD6B7169203331,
        is_remote=True,
        trace_state=TraceState([("vendor", "x1")]),
    )
    for index, tracer in enumerate(tracers):
        with tracer.start_as_current_span("kvscope.request", attributes=ODD_VALUES) as parent:
            parent.add_event("kvscope.timeline", {"kvscope.timeline.point": "queued", "n": 1})
            parent.add_event("empty")
            with tracer.start_as_current_span(
                "kvscope.hook.get_num_new_matched_tokens",
                kind=SpanKind(index % 5),
                links=[Link(remote, {"kvscope.request.id": "r1"}), Link(parent.get_span_context())],
            ) as child:
                child.set_status(Status(StatusCode.ERROR, "load failed: peer gone"))
        context = trace.set_span_in_context(trace.NonRecordingSpan(remote))
        span = tracer.start_span("kvscope.worker.request", context=context)
        span.set_status(Status(StatusCode.OK))
        span.end()
    return exporter.get_finished_spans()


def test_bytes_parse_into_the_sdk_encoders_message():
    spans = _spans()
    ours = ExportTraceServiceRequest.FromString(encode_spans(spans))
    links = [
        link
        for r in ours.resource_spans
        for s in r.scope_spans
        for span in s.spans
        for link in span.links
    ]
    # The SDK's encoder leaves a link's trace_state out; OTLP has the field, and we send it.
    assert {link.trace_state for link in links} == {"vendor=x1", ""}
    for link in links:
        link.ClearField("trace_state")
    assert ours == sdk_encode(spans)
    assert len(ours.resource_spans) == 2
    assert sum(len(s.spans) for r in ours.resource_spans for s in r.scope_spans) == len(spans)


def test_repeated_encoding_is_stable_with_the_attribute_cache_warm():
    spans = _spans()
    assert encode_spans(spans) == encode_spans(spans)
    assert encode_spans([]) == b""
