"""OTLP receivers for benches: accept trace exports over HTTP or gRPC, count them, drop them.

They stand in for the backend and for Jaeger where only the exporter's side is measured: the
engine encodes and sends every span for real, and the receiver can answer late (`delay_s`) to
play a slow collector.
"""

import threading
import time
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from kvscope.harness.engine import free_port


class HttpSink:
    """POST /v1/traces on 127.0.0.1; answers 200 with an empty ExportTraceServiceResponse."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.delay_s = delay_s
        self.requests = 0
        self.bytes = 0
        sink = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # kept-alive connections, as collectors keep them

            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                sink.requests += 1
                sink.bytes += len(body)
                time.sleep(sink.delay_s)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self._server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self._server.server_port}/v1/traces"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class GrpcSink:
    """The OTLP TraceService over gRPC on 127.0.0.1, as Jaeger's port 4317 offers it."""

    def __init__(self, delay_s: float = 0.0) -> None:
        import grpc
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

        self.delay_s = delay_s
        self.requests = 0
        sink = self

        class Service(trace_service_pb2_grpc.TraceServiceServicer):
            def Export(self, request, context):  # noqa: N802 (gRPC's naming)
                sink.requests += 1
                time.sleep(sink.delay_s)
                return trace_service_pb2.ExportTraceServiceResponse()

        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Service(), self._server)
        port = self._server.add_insecure_port("127.0.0.1:0")
        self._server.start()
        self.endpoint = f"grpc://127.0.0.1:{port}"

    def close(self) -> None:
        self._server.stop(grace=None)


def closed_endpoint(scheme: str = "http") -> str:
    """An endpoint nothing listens on: a collector that is down."""
    port = free_port()
    return f"grpc://127.0.0.1:{port}" if scheme == "grpc" else f"http://127.0.0.1:{port}/v1/traces"
