"""OTLP/gRPC into the backend, with the SDK's own gRPC exporter and a raw TraceService stub: the
same token, limits, partial success and store as OTLP/HTTP."""

import gzip
import socket
import time
import uuid

import grpc
import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as pb
from opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc import TraceServiceStub
from opentelemetry.sdk.trace.export import SpanExportResult

from kvscope.harness.engine import free_port

from ..story import Process, load_story

pytestmark = pytest.mark.timeout(60)
TOKEN = "grpc-test-token"
CALL_TIMEOUT_S = 10


def _story(engine_id: str) -> list:
    scheduler = Process("vllm-engine", engine_id, "scheduler")
    worker = Process("vllm-worker", engine_id, "worker")
    load_story(scheduler, worker, None, f"req-{engine_id}", time.time_ns())
    return scheduler.spans() + worker.spans()


def _grpc_backend(make_backend, **overrides):
    backend = make_backend(grpc=True, grpc_port=free_port(), **overrides)
    assert backend.app.state.grpc_port == backend.settings.grpc_port
    return backend


def _sdk_export(backend, spans, metadata: dict | None) -> SpanExportResult:
    exporter = OTLPSpanExporter(
        endpoint=f"http://127.0.0.1:{backend.settings.grpc_port}",
        insecure=True,
        headers=metadata,
        timeout=CALL_TIMEOUT_S,
    )
    try:
        return exporter.export(spans)
    finally:
        exporter.shutdown()


def _call(backend, body: bytes, metadata=(), compression=None) -> pb.ExportTraceServiceResponse:
    """One raw Export call: the bytes as given, the gRPC error as raised."""
    channel = grpc.insecure_channel(f"127.0.0.1:{backend.settings.grpc_port}")
    try:
        export = TraceServiceStub(channel).Export
        request = pb.ExportTraceServiceRequest.FromString(body)
        return export(request, metadata=metadata, timeout=CALL_TIMEOUT_S, compression=compression)
    finally:
        channel.close()


def _stored_requests(backend, engine_id: str) -> int:
    with backend.client() as client:
        return client.get("/api/v1/requests", params={"engine_id": engine_id}).json()["total"]


def test_sdk_grpc_exporter_with_the_token_is_stored(make_backend):
    backend = _grpc_backend(make_backend, token=TOKEN)
    engine_id = f"engine-{uuid.uuid4().hex[:6]}"
    metadata = {"authorization": f"Bearer {TOKEN}"}
    assert _sdk_export(backend, _story(engine_id), metadata) == SpanExportResult.SUCCESS
    assert _stored_requests(backend, engine_id) == 1
    with backend.client() as client:
        [request] = client.get("/api/v1/requests", params={"engine_id": engine_id}).json()["items"]
        timeline = client.get(f"/api/v1/requests/{request['id']}/timeline").json()
    assert {"lookup_start", "transfer_complete", "finished"} <= {
        p["point"] for p in timeline["points"]
    }


def test_without_a_token_configured_any_call_is_stored(make_backend):
    backend = _grpc_backend(make_backend)
    engine_id = f"engine-{uuid.uuid4().hex[:6]}"
    assert _sdk_export(backend, _story(engine_id), None) == SpanExportResult.SUCCESS
    assert _stored_requests(backend, engine_id) == 1


@pytest.mark.parametrize("metadata", [(), (("authorization", "Bearer wrong"),)])
def test_a_missing_or_wrong_token_is_unauthenticated_and_stores_nothing(make_backend, metadata):
    backend = _grpc_backend(make_backend, token=TOKEN)
    engine_id = f"engine-{uuid.uuid4().hex[:6]}"
    body = encode_spans(_story(engine_id)).SerializeToString()
    with pytest.raises(grpc.RpcError) as raised:
        _call(backend, body, metadata)
    assert raised.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "authorization: Bearer <KVSCOPE_BACKEND_TOKEN>" in raised.value.details()
    assert _sdk_export(backend, _story(engine_id), None) == SpanExportResult.FAILURE
    assert _stored_requests(backend, engine_id) == 0


def test_invalid_spans_get_partial_success_as_over_http(make_backend):
    backend = _grpc_backend(make_backend)
    request = encode_spans(_story(f"engine-{uuid.uuid4().hex[:6]}"))
    spans = request.resource_spans[0].scope_spans[0].spans
    spans[0].trace_id = bytes(16)
    spans[1].span_id = b"\x01\x02"
    partial = _call(backend, request.SerializeToString()).partial_success
    assert partial.rejected_spans == 2
    assert "traceId must be 16 bytes" in partial.error_message
    lone = pb.ExportTraceServiceRequest()
    lone.resource_spans.add().scope_spans.add().spans.add().CopyFrom(spans[0])
    with pytest.raises(grpc.RpcError) as raised:
        _call(backend, lone.SerializeToString())
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "all 1 spans rejected" in raised.value.details()


def test_messages_beyond_the_body_limit_are_refused_compressed_or_not(make_backend):
    backend = _grpc_backend(make_backend, max_body_bytes=64 * 1024)
    engine_id = f"engine-{uuid.uuid4().hex[:6]}"
    request = encode_spans(_story(engine_id))
    # One huge, highly compressible attribute: small on the wire, 256 KiB once inflated.
    attribute = request.resource_spans[0].scope_spans[0].spans[0].attributes.add()
    attribute.key, attribute.value.string_value = "padding", "x" * (256 * 1024)
    assert len(gzip.compress(request.SerializeToString())) < 64 * 1024
    for compression in (None, grpc.Compression.Gzip):
        with pytest.raises(grpc.RpcError) as raised:
            _call(backend, request.SerializeToString(), compression=compression)
        assert raised.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, compression
    assert _stored_requests(backend, engine_id) == 0
    assert _sdk_export(backend, _story(engine_id), None) == SpanExportResult.SUCCESS


def test_a_taken_grpc_port_leaves_http_serving(make_backend):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        backend = make_backend(grpc=True, grpc_port=port)
        assert backend.app.state.grpc_port is None
        assert backend.export(_story(f"engine-{uuid.uuid4().hex[:6]}")) == SpanExportResult.SUCCESS


def test_a_second_backend_cannot_share_the_grpc_port(make_backend):
    # grpcio would set SO_REUSEPORT and let both bind, each getting some of the connections.
    first = _grpc_backend(make_backend)
    second = make_backend(grpc=True, grpc_port=first.settings.grpc_port)
    assert second.app.state.grpc_port is None
