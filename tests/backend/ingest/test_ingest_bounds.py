"""Ingest under pressure and odd bodies, against a running backend: a bound on requests in
progress (503 + Retry-After over HTTP, UNAVAILABLE over gRPC, and the SDK exporter retries it),
multi-member gzip read whole, trailing bytes refused, invalid UTF-8 repaired."""

import gzip
import socket
import threading
import time
import uuid

import grpc
import httpx
import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as pb
from opentelemetry.sdk.trace.export import SpanExportResult

from kvscope.backend.ingest.body import PROTOBUF
from kvscope.harness.engine import free_port
from kvscope.traces import names
from tests.backend.story import Process

HELD_BODY = b'{"resourceSpans": []}'


def _spans(engine_id: str, **attributes) -> list:
    process = Process("vllm-prefill", engine_id, "scheduler", f"proc-{engine_id}")
    now = time.time_ns()
    span = process.start(names.SPAN_REQUEST, now, **{names.REQUEST_ID: "req-1", **attributes})
    span.end(end_time=now + 1000)
    return process.spans()


def _stored(backend, engine_id: str) -> list:
    with backend.client() as client:
        return client.get("/api/v1/requests", params={"engine_id": engine_id}).json()["items"]


class HeldUpload:
    """An upload that has sent its headers and part of its body: it holds an ingest slot."""

    def __init__(self, backend) -> None:
        port = int(backend.url.rsplit(":", 1)[1])
        self.socket = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.socket.sendall(
            b"POST /v1/traces HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(HELD_BODY)}\r\n\r\n".encode()
            + HELD_BODY[:5]
        )
        time.sleep(0.3)  # the server has read the headers and waits for the rest

    def release(self) -> bytes:
        self.socket.sendall(HELD_BODY[5:])
        answer = self.socket.recv(4096)
        self.socket.close()
        return answer


@pytest.fixture
def bounded(make_backend, database_url):
    if not database_url.startswith("sqlite"):
        pytest.skip("the bound and the body checks do not depend on the database")
    return make_backend(grpc=True, grpc_port=free_port(), max_concurrent_ingest=1)


def test_beyond_the_bound_http_gets_503_with_retry_after_and_grpc_unavailable(bounded):
    engine_id = f"engine-{uuid.uuid4().hex[:6]}"
    body = encode_spans(_spans(engine_id)).SerializeToString()
    held = HeldUpload(bounded)
    with httpx.Client(base_url=bounded.url, timeout=10) as client:
        busy = client.post("/v1/traces", content=body, headers={"Content-Type": PROTOBUF})
    assert busy.status_code == 503 and busy.headers["Retry-After"] == "1"
    channel = grpc.insecure_channel(f"127.0.0.1:{bounded.settings.grpc_port}")
    export = channel.unary_unary(
        "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
        request_serializer=None,
        response_deserializer=pb.ExportTraceServiceResponse.FromString,
    )
    with pytest.raises(grpc.RpcError) as refused:
        export(body, timeout=10)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    assert b" 400 " in held.release()  # the held upload finishes (an empty request: 400)
    export(body, timeout=10)  # the slot is free again
    channel.close()
    assert len(_stored(bounded, engine_id)) == 1


def test_the_sdk_exporter_retries_until_a_slot_frees(bounded):
    engine_id = f"engine-{uuid.uuid4().hex[:6]}"
    held = HeldUpload(bounded)
    threading.Timer(1.5, held.release).start()
    started = time.monotonic()
    assert bounded.export(_spans(engine_id)) == SpanExportResult.SUCCESS
    assert time.monotonic() - started >= 1.0  # it waited, retried and got in
    assert bounded.app.state.ingest_gate.refused >= 1
    assert len(_stored(bounded, engine_id)) == 1


def _post(backend, body: bytes, encoding: str | None = "gzip") -> httpx.Response:
    headers = {"Content-Type": PROTOBUF, **({"Content-Encoding": encoding} if encoding else {})}
    with httpx.Client(base_url=backend.url, timeout=10) as client:
        return client.post("/v1/traces", content=body, headers=headers)


def test_every_gzip_member_is_read_and_trailing_bytes_are_refused(bounded):
    first, second = (f"engine-{uuid.uuid4().hex[:6]}" for _ in range(2))
    members = [encode_spans(_spans(engine)).SerializeToString() for engine in (first, second)]
    # Two gzip members whose bodies concatenate into one request (protobuf merges them).
    assert _post(bounded, gzip.compress(members[0]) + gzip.compress(members[1])).is_success
    assert len(_stored(bounded, first)) == 1 and len(_stored(bounded, second)) == 1
    third = f"engine-{uuid.uuid4().hex[:6]}"
    body = gzip.compress(encode_spans(_spans(third)).SerializeToString())
    for malformed in (body + b"trailing", body[:-4]):
        answer = _post(bounded, malformed)
        assert answer.status_code == 400
    assert _stored(bounded, third) == []
    assert bounded.export(_spans(third), compression=Compression.Gzip) == SpanExportResult.SUCCESS


def test_a_string_that_is_not_utf8_is_stored_repaired(bounded):
    engine_id = f"engine-{uuid.uuid4().hex[:6]}"
    spans = _spans(engine_id, **{names.CONNECTOR_NAME: "Offload-XYZ"})
    body = encode_spans(spans).SerializeToString().replace(b"Offload-XYZ", b"Offload-\xff\xfeZ")
    answer = _post(bounded, body, encoding=None)
    assert answer.status_code == 200
    partial = pb.ExportTraceServiceResponse.FromString(answer.content).partial_success
    assert partial.rejected_spans == 0 and "invalid UTF-8" in partial.error_message
    assert _stored(bounded, engine_id)[0]["connector"] == "Offload-\ufffd\ufffdZ"
