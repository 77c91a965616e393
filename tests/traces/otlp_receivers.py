"""Real OTLP receivers for tests: a grpcio TraceService and an HTTP server, recording what came."""

import threading
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

WAIT_S = 10
"""The longest any test waits for an export to arrive."""


def span_names(request: ExportTraceServiceRequest) -> list[str]:
    return [s.name for r in request.resource_spans for ss in r.scope_spans for s in ss.spans]


class GrpcReceiver:
    """OTLP/gRPC on 127.0.0.1: records each call's invocation metadata and span names."""

    def __init__(self) -> None:
        self.calls: list[tuple[dict[str, str], list[str]]] = []
        self.arrived = threading.Event()
        receiver = self

        class Service(trace_service_pb2_grpc.TraceServiceServicer):
            def Export(self, request, context):  # noqa: N802 (gRPC's naming)
                metadata = {key: value for key, value in context.invocation_metadata()}
                receiver.calls.append((metadata, span_names(request)))
                receiver.arrived.set()
                return trace_service_pb2.ExportTraceServiceResponse()

        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Service(), self._server)
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        self._server.start()
        self.url = f"grpc://127.0.0.1:{self.port}"

    def metadata(self) -> dict[str, str]:
        """The first call's metadata, waiting for it."""
        assert self.arrived.wait(WAIT_S), f"nothing arrived at {self.url} in {WAIT_S} s"
        return self.calls[0][0]

    def close(self) -> None:
        self._server.stop(grace=None)


class HttpReceiver:
    """OTLP/HTTP on 127.0.0.1 answering 200: records each request's headers and span names."""

    def __init__(self) -> None:
        self.calls: list[tuple[dict[str, str], list[str]]] = []
        self.arrived = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers["Content-Length"]))
                names = span_names(ExportTraceServiceRequest.FromString(body))
                headers = {key.lower(): value for key, value in self.headers.items()}
                receiver.calls.append((headers, names))
                receiver.arrived.set()
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self._server.server_port
        self.url = f"http://127.0.0.1:{self.port}/v1/traces"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def metadata(self) -> dict[str, str]:
        assert self.arrived.wait(WAIT_S), f"nothing arrived at {self.url} in {WAIT_S} s"
        return self.calls[0][0]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
