"""One OTLP export request, whatever carried it: token check, then decode, limits and store,
answered as an HTTP status that maps onto a google.rpc code (OTLP/HTTP and OTLP/gRPC share it)."""

from dataclasses import dataclass

from kvscope.backend.deps import token_matches
from kvscope.backend.ingest import IngestService
from kvscope.backend.otlp import PayloadError, encode_response
from kvscope.backend.settings import Settings
from kvscope.backend.writer import StoreUnavailable

RPC_CODES = {400: 3, 401: 16, 413: 8, 415: 3, 503: 14}
"""google.rpc.Code per HTTP status: OTLP/HTTP sends it in a Status body, OTLP/gRPC as the call's
status (INVALID_ARGUMENT, UNAUTHENTICATED, RESOURCE_EXHAUSTED, UNAVAILABLE: exporters retry it)."""


@dataclass(frozen=True)
class Answer:
    """200 with `body` (an ExportTraceServiceResponse, partial success included), or an error."""

    status: int
    message: str = ""
    body: bytes = b""
    retry_after_s: int | None = None

    @property
    def rpc_code(self) -> int:
        return 0 if self.status == 200 else RPC_CODES.get(self.status, 2)


def refused(settings: Settings, authorization: str | None, how: str) -> Answer | None:
    """401 unless the token matches (or none is configured); `how` says what to send."""
    if token_matches(settings, authorization):
        return None
    return Answer(401, f"missing or wrong bearer token: send {how}")


def store(ingest: IngestService, body: bytes, content_type: str) -> Answer:
    """Stores every valid span of one (decompressed, size-checked) export request."""
    try:
        stored = ingest.ingest(body, content_type)
    except PayloadError as error:
        return Answer(400, str(error))
    except StoreUnavailable as error:
        # What OTLP exporters retry on (503 with Retry-After, gRPC UNAVAILABLE): nothing is lost.
        return Answer(503, str(error), retry_after_s=1)
    if stored.rejected and not stored.spans:
        return Answer(400, f"all {stored.rejected} spans rejected: {stored.message}")
    return Answer(200, body=encode_response(content_type, stored.rejected, stored.message))
