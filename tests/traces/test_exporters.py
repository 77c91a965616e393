"""kvscope's OTLP exporters against real HTTP and gRPC receivers: bodies, headers, retries."""

import fcntl
import gzip
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from kvscope.bench.backend.otlp_sink import GrpcSink, closed_endpoint
from kvscope.traces.sdk.exporters import (
    DEFAULT_TIMEOUT_S,
    OtlpGrpcExporter,
    OtlpHttpExporter,
    OtlpJsonFileExporter,
    timeout_from_env,
)
from kvscope.traces.sdk.otlp_json import read_spans_file, spans_to_otlp_json


class Receiver:
    """An OTLP/HTTP receiver answering with scripted status codes (then 200), recording each
    request's headers, body, target and client port; HTTP/1.1 keeps connections open."""

    def __init__(self, statuses: list[int] = (), protocol: str = "HTTP/1.0") -> None:
        self.statuses = list(statuses)
        self.received: list[tuple[dict, bytes]] = []
        self.targets: list[str] = []
        self.client_ports: list[int] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = protocol

            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.received.append((dict(self.headers), body))
                receiver.targets.append(self.path)
                receiver.client_ports.append(self.client_address[1])
                self.send_response(receiver.statuses.pop(0) if receiver.statuses else 200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/v1/traces"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    made = []

    def make(statuses=(), protocol="HTTP/1.0"):
        made.append(Receiver(statuses, protocol))
        return made[-1]

    yield make
    for r in made:
        r.close()


def _spans(count: int = 3):
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "kvscope-test"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("kvscope")
    for i in range(count):
        with tracer.start_as_current_span("kvscope.hook.start_load_kv", attributes={"i": i}):
            pass
    return exporter.get_finished_spans()


def _names(body: bytes) -> list[str]:
    request = ExportTraceServiceRequest.FromString(body)
    return [s.name for r in request.resource_spans for ss in r.scope_spans for s in ss.spans]


def test_protobuf_with_standard_headers_and_gzip(receiver, monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-tenant=kv%20scope")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", "gzip")
    sink = receiver()
    exporter = OtlpHttpExporter(sink.url, headers={"Authorization": "Bearer t"})
    assert exporter.export(_spans()) == SpanExportResult.SUCCESS
    headers, body = sink.received[0]
    assert headers["Content-Type"] == "application/x-protobuf"
    assert headers["Content-Encoding"] == "gzip"
    assert headers["x-tenant"] == "kv scope" and headers["Authorization"] == "Bearer t"
    assert _names(gzip.decompress(body)) == ["kvscope.hook.start_load_kv"] * 3


def test_json_encoding(receiver):
    sink = receiver()
    assert OtlpHttpExporter(sink.url, encoding="json").export(_spans(1)) == SpanExportResult.SUCCESS
    headers, body = sink.received[0]
    assert headers["Content-Type"] == "application/json"
    assert b'"kvscope.hook.start_load_kv"' in body


def test_batches_share_one_kept_alive_connection(receiver):
    sink = receiver(protocol="HTTP/1.1")
    exporter = OtlpHttpExporter(sink.url)
    for _ in range(3):
        assert exporter.export(_spans(1)) == SpanExportResult.SUCCESS
    assert len(sink.client_ports) == 3 and len(set(sink.client_ports)) == 1


def test_goes_through_the_proxy_the_environment_names(receiver, monkeypatch):
    proxy = receiver()
    for name in ("NO_PROXY", "no_proxy", "http_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", proxy.url.removesuffix("/v1/traces"))
    endpoint = "http://collector.invalid:4318/v1/traces"
    assert OtlpHttpExporter(endpoint).export(_spans(1)) == SpanExportResult.SUCCESS
    assert proxy.targets == [endpoint]


def test_retries_a_busy_receiver_then_delivers(receiver):
    sink = receiver([503, 429])
    assert OtlpHttpExporter(sink.url).export(_spans()) == SpanExportResult.SUCCESS
    assert len(sink.received) == 3


def test_a_rejected_batch_fails_at_once(receiver):
    sink = receiver([400])
    assert OtlpHttpExporter(sink.url).export(_spans()) == SpanExportResult.FAILURE
    assert len(sink.received) == 1


def test_a_closed_port_fails_within_the_timeout():
    start = time.monotonic()
    result = OtlpHttpExporter(closed_endpoint(), timeout_s=1.5).export(_spans())
    assert result == SpanExportResult.FAILURE
    assert time.monotonic() - start < 5


def test_shutdown_ends_a_retrying_export_promptly():
    exporter = OtlpHttpExporter(closed_endpoint(), timeout_s=60)
    outcome = []
    worker = threading.Thread(target=lambda: outcome.append(exporter.export(_spans())))
    worker.start()
    time.sleep(0.3)
    exporter.shutdown()
    worker.join(timeout=5)
    assert outcome == [SpanExportResult.FAILURE]


def test_grpc_exporter_delivers_directly_encoded_requests():
    sink = GrpcSink()
    try:
        endpoint = sink.endpoint.replace("grpc://", "http://")
        exporter = OtlpGrpcExporter(endpoint=endpoint, insecure=True)
        assert exporter.export(_spans()) == SpanExportResult.SUCCESS
        assert sink.requests == 1
        exporter.shutdown()
    finally:
        sink.close()


def test_the_environments_timeout_bounds_the_retries(monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "1")
    start = time.monotonic()
    result = OtlpHttpExporter(closed_endpoint()).export(_spans())
    assert result == SpanExportResult.FAILURE
    assert time.monotonic() - start < 2.5  # 10 s of retries (0.5 + 1 + 2 + 4 s) without it


@pytest.mark.parametrize("raw", ["soon", "0", "-3"])
def test_a_bad_timeout_in_the_environment_is_named_and_the_default_used(monkeypatch, caplog, raw):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", raw)
    assert timeout_from_env() == DEFAULT_TIMEOUT_S
    assert repr(raw) in caplog.text


def test_a_spans_file_is_never_read_with_a_line_half_written(tmp_path):
    provider = TracerProvider(resource=Resource({"service.name": "file-test"}))
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    with provider.get_tracer("t").start_as_current_span("whole", attributes={"a": "x" * 9000}):
        pass
    path = tmp_path / "spans.jsonl"
    OtlpJsonFileExporter(path).export(memory.get_finished_spans())
    line = spans_to_otlp_json(memory.get_finished_spans()) + "\n"
    half_written = threading.Event()

    def write_slowly() -> None:  # as a process exporting beside the reader, its lock held
        with open(path, "a", encoding="utf-8") as out:
            fcntl.flock(out, fcntl.LOCK_EX)
            out.write(line[:4000])
            out.flush()
            half_written.set()
            time.sleep(0.3)
            out.write(line[4000:])

    writer = threading.Thread(target=write_slowly)
    writer.start()
    half_written.wait(5)
    spans = read_spans_file(path)  # waits for the line's end
    writer.join(5)
    assert [span["name"] for span in spans] == ["whole", "whole"]
