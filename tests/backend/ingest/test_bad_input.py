"""Malformed, oversized or unauthorized input: a clear 4xx each, nothing stored is lost."""

import gzip
import time
import uuid

import pytest
from google.rpc import status_pb2
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as pb
from opentelemetry.sdk.trace.export import SpanExportResult

from kvscope.traces import names

from ..story import Process, load_story

pytestmark = pytest.mark.timeout(60)
PROTOBUF = {"Content-Type": "application/x-protobuf"}


def _story(engine_id: str) -> list:
    scheduler = Process("vllm-engine", engine_id, "scheduler")
    worker = Process("vllm-worker", engine_id, "worker")
    load_story(scheduler, worker, None, f"req-{engine_id}", time.time_ns())
    return scheduler.spans() + worker.spans()


def _stored_requests(client, engine_id: str) -> int:
    return client.get("/api/v1/requests", params={"engine_id": engine_id}).json()["total"]


def _status_message(response) -> str:
    return status_pb2.Status.FromString(response.content).message


def test_bad_bodies_get_4xx_and_keep_what_was_stored(make_backend):
    backend = make_backend(max_body_bytes=64 * 1024, max_decompressed_bytes=256 * 1024)
    good = f"engine-{uuid.uuid4().hex[:6]}"
    assert backend.export(_story(good)) == SpanExportResult.SUCCESS
    body = encode_spans(_story("x")).SerializeToString()
    cases = {
        "truncated protobuf": (body[: len(body) // 2], PROTOBUF, 400),
        "garbage protobuf": (b"\xff\xfe\xfd not a protobuf at all", PROTOBUF, 400),
        "wrong content type": (body, {"Content-Type": "text/plain"}, 415),
        "no content type": (body, {}, 415),
        "oversized body": (b"\x00" * (65 * 1024), PROTOBUF, 413),
        "gzip bomb": (
            gzip.compress(b"\x00" * (2 * 1024 * 1024)),
            {**PROTOBUF, "Content-Encoding": "gzip"},
            413,
        ),
        "broken gzip": (b"\x1f\x8b\x08garbage", {**PROTOBUF, "Content-Encoding": "gzip"}, 400),
        "unknown encoding": (body, {**PROTOBUF, "Content-Encoding": "br"}, 415),
        "broken json": (b'{"resourceSpans": [', {"Content-Type": "application/json"}, 400),
        "json of wrong shape": (b'{"resourceSpans": 5}', {"Content-Type": "application/json"}, 400),
        # JSON escapes allow lone UTF-16 surrogates, which no protobuf string can hold.
        "lone surrogate": (
            b'{"resourceSpans": ["\\ud800"]}',
            {"Content-Type": "application/json"},
            400,
        ),
        "lone surrogate key": (b'{"\\udfff": 1}', {"Content-Type": "application/json"}, 400),
    }
    with backend.client() as client:
        for label, (content, headers, expected) in cases.items():
            response = client.post("/v1/traces", content=content, headers=headers)
            assert response.status_code == expected, (label, response.status_code, response.text)
            assert response.content, f"{label}: an error must say what is wrong"
        assert "not a valid OTLP protobuf" in _status_message(
            client.post("/v1/traces", content=b"\xff\xff\xff", headers=PROTOBUF)
        )
        assert _stored_requests(client, good) == 1
    again = f"engine-{uuid.uuid4().hex[:6]}"
    assert backend.export(_story(again)) == SpanExportResult.SUCCESS
    with backend.client() as client:
        assert _stored_requests(client, again) == 1
        assert client.get("/health").json()["status"] == "ok"


def test_invalid_spans_are_rejected_one_by_one_with_partial_success(backend):
    engine_id = f"engine-{uuid.uuid4().hex[:6]}"
    request = encode_spans(_story(engine_id))
    spans = request.resource_spans[0].scope_spans[0].spans
    spans[0].trace_id = bytes(16)
    spans[1].span_id = b"\x01\x02"
    kept = len(spans) - 2
    with backend.client() as client:
        response = client.post("/v1/traces", content=request.SerializeToString(), headers=PROTOBUF)
        assert response.status_code == 200
        partial = pb.ExportTraceServiceResponse.FromString(response.content).partial_success
        assert partial.rejected_spans == 2
        assert "traceId must be 16 bytes" in partial.error_message
        assert "spanId must be 8 bytes" in partial.error_message
        origin = next(
            kv.value.string_value
            for kv in request.resource_spans[0].resource.attributes
            if kv.key == names.PROCESS_ID
        )
        [stream] = [s for s in client.get("/api/v1/streams").json() if s["origin"] == origin]
        assert stream["received"] == kept  # the valid spans are stored...
        assert sum(h["count"] for h in stream["holes"]) == 2  # ...and the rejected ones show
        lone = pb.ExportTraceServiceRequest()
        lone.resource_spans.add().scope_spans.add().spans.add().CopyFrom(spans[0])
        response = client.post("/v1/traces", content=lone.SerializeToString(), headers=PROTOBUF)
        assert response.status_code == 400
        assert "all 1 spans rejected" in _status_message(response)


def test_huge_attributes_are_cut_to_the_limit_and_flagged(make_backend):
    backend = make_backend(max_attribute_value_bytes=1024, max_attribute_array_len=16)
    engine_id = f"engine-{uuid.uuid4().hex[:6]}"
    process = Process("vllm-engine", engine_id, "scheduler")
    span = process.start(
        names.SPAN_REQUEST,
        time.time_ns(),
        **{
            names.REQUEST_ID: "huge",
            "kvscope.note": "x" * 200_000,
            names.BLOCK_IDS: list(range(5000)),
        },
    )
    span.end()
    request = encode_spans(process.spans())
    with backend.client() as client:
        response = client.post("/v1/traces", content=request.SerializeToString(), headers=PROTOBUF)
        assert response.status_code == 200
        partial = pb.ExportTraceServiceResponse.FromString(response.content).partial_success
        assert partial.rejected_spans == 0
        assert "attributes truncated" in partial.error_message
        [stored_request] = client.get("/api/v1/requests", params={"engine_id": engine_id}).json()[
            "items"
        ]
        [stored] = client.get(f"/api/v1/requests/{stored_request['id']}/spans").json()
    attributes = stored["attributes"]
    assert len(attributes["kvscope.note"]) < 1100
    assert len(attributes[names.BLOCK_IDS]) == 16
    assert set(attributes["kvscope.backend.truncated"]) == {"kvscope.note", names.BLOCK_IDS}


def test_token_guards_ingest_reads_and_websocket(make_backend):
    backend = make_backend(token="s3cret")
    spans = _story(f"engine-{uuid.uuid4().hex[:6]}")
    assert backend.export(spans, token="wrong") == SpanExportResult.FAILURE
    with backend.client(token="wrong") as client:
        response = client.post("/v1/traces", content=b"", headers=PROTOBUF)
        assert response.status_code == 401
        assert client.get("/api/v1/requests").status_code == 401
        assert client.get("/api/v1/blocks").status_code == 401
        assert client.get("/health").status_code == 200  # compose probes carry no token
    with backend.client(token="") as client:
        assert client.get("/api/v1/requests").status_code == 401
    assert backend.export(spans) == SpanExportResult.SUCCESS
    with backend.client() as client:
        engine_id = spans[0].attributes[names.ENGINE_ID]
        assert _stored_requests(client, engine_id) == 1


def test_events_dated_beyond_2262_are_dropped_and_the_span_kept(backend):
    """Found by fuzzing: such a timestamp overflowed a 64-bit column and failed the batch."""
    engine_id = f"engine-{uuid.uuid4().hex[:6]}"
    request = encode_spans(_story(engine_id))
    span = request.resource_spans[0].scope_spans[0].spans[0]
    span.events.add(name=names.EVENT_TIMELINE, time_unix_nano=2**64 - 1).attributes.add(
        key=names.TIMELINE_POINT
    ).value.string_value = "lookup_start"
    with backend.client() as client:
        response = client.post("/v1/traces", content=request.SerializeToString(), headers=PROTOBUF)
        assert response.status_code == 200, response.text
        partial = pb.ExportTraceServiceResponse.FromString(response.content).partial_success
        assert partial.rejected_spans == 0
        assert "events dated beyond the year 2262 dropped" in partial.error_message
        assert _stored_requests(client, engine_id) == 1


def test_out_of_range_query_numbers_get_422(backend):
    """Found by fuzzing: numbers beyond 64 bits (or an infinite window) crashed the query."""
    with backend.client() as client:
        for path, params in [
            ("/api/v1/requests/9223372036854775808", {}),
            ("/api/v1/requests/9223372036854775808/timeline", {}),
            ("/api/v1/requests", {"since_ns": 2**63}),
            ("/api/v1/failures", {"offset": 2**64}),
            ("/api/v1/stats/summary", {"window_s": "inf"}),
            ("/api/v1/stats/hits", {"window_s": 1e12}),
        ]:
            response = client.get(path, params=params)
            assert response.status_code == 422, (path, params, response.text)
