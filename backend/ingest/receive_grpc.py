"""The OTLP/gRPC trace receiver (TraceService/Export) beside OTLP/HTTP: the same token, limits,
decode, partial success and store, through backend/ingest/receive.py."""

import logging
from concurrent import futures

import grpc

from kvscope.backend.ingest.body import PROTOBUF
from kvscope.backend.ingest.pipeline import Pipeline
from kvscope.backend.ingest.receive import IngestGate, answer, refused
from kvscope.backend.settings import Settings

logger = logging.getLogger(__name__)

SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"
TOKEN_HOW = "the metadata 'authorization: Bearer <KVSCOPE_BACKEND_TOKEN>'"
_STATUS = {code.value[0]: code for code in grpc.StatusCode}


class GrpcReceiver:
    """A grpcio server whose Export handler takes the request's bytes as they came: the ingest
    path decodes them (in its worker processes) exactly as it decodes an OTLP/HTTP body."""

    def __init__(
        self, ingest: Pipeline, settings: Settings, gate: IngestGate, threads: int = 4
    ) -> None:
        self.ingest = ingest
        self.gate = gate
        self.settings = settings
        self.port: int | None = None
        # gRPC refuses a larger message with RESOURCE_EXHAUSTED before any of it is decoded; a
        # compressed one is checked once inflated, so this also bounds decompression.
        limit = min(settings.max_body_bytes, settings.max_decompressed_bytes)
        self._server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=threads, thread_name_prefix="otlp-grpc"),
            # No SO_REUSEPORT (grpcio's default): a second backend on the port must fail, not
            # silently take half of the connections.
            options=[("grpc.max_receive_message_length", limit), ("grpc.so_reuseport", 0)],
            # Calls waiting for a thread hold their messages too: beyond the ingest bound
            # gRPC answers RESOURCE_EXHAUSTED itself.
            maximum_concurrent_rpcs=max(threads, settings.max_concurrent_ingest),
        )
        # No deserializer: the request is its bytes.
        handler: grpc.RpcMethodHandler[bytes, bytes] = grpc.unary_unary_rpc_method_handler(
            self._export
        )
        self._server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(SERVICE, {"Export": handler}),)
        )

    def start(self, host: str, port: int) -> int:
        """Listens on host:port; returns the port. RuntimeError when it cannot bind."""
        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        bound = self._server.add_insecure_port(address)
        if not bound:  # older grpcio answers 0 instead of raising
            raise RuntimeError(f"failed to bind to address {address}")
        self._server.start()
        self.port = bound
        return bound

    def stop(self, grace_s: float = 2.0) -> None:
        """Lets calls in progress finish (up to grace_s), refusing new ones."""
        self._server.stop(grace_s).wait(grace_s + 1)

    def _export(self, body: bytes, context: grpc.ServicerContext) -> bytes:
        metadata = dict(context.invocation_metadata())
        # gRPC gives bytes only for keys ending in -bin.
        authorization = metadata.get("authorization")
        token = authorization if isinstance(authorization, str) else None
        reply = refused(self.settings, token, TOKEN_HOW)
        if reply is None:
            with self.gate.admit() as busy:
                reply = busy or answer(self.ingest, body, PROTOBUF)
        if reply.status != 200:
            context.abort(_STATUS[reply.rpc_code], reply.message)
        return reply.body


def start_receiver(
    ingest: Pipeline, settings: Settings, host: str, gate: IngestGate
) -> GrpcReceiver | None:
    """The receiver on host:settings.grpc_port, or None (with a warning) if that port is taken:
    OTLP/HTTP keeps serving. A local Jaeger or collector often holds 4317."""
    receiver = GrpcReceiver(ingest, settings, gate)
    try:
        receiver.start(host, settings.grpc_port)
    except RuntimeError as error:
        logger.warning(
            "kvscope backend: no OTLP/gRPC receiver (%s; is Jaeger or a collector on port %d?): "
            "set KVSCOPE_BACKEND_GRPC_PORT or --grpc-port to a free port, or 0 for none",
            error,
            settings.grpc_port,
        )
        receiver.stop(0)
        return None
    return receiver
