"""One OTLP export request, whatever carried it: token check, then decode, limits and store,
answered as an HTTP status that maps onto a google.rpc code (OTLP/HTTP and OTLP/gRPC share it)."""

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from kvscope.backend.ingest.body import BodyError, decompress
from kvscope.backend.ingest.commit import StoreUnavailable
from kvscope.backend.ingest.decode import PayloadError, encode_response
from kvscope.backend.ingest.pipeline import Pipeline
from kvscope.backend.settings import Settings, token_matches

RPC_CODES = {400: 3, 401: 16, 403: 7, 413: 8, 415: 3, 503: 14}
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


def answer(ingest: Pipeline, body: bytes, content_type: str) -> Answer:
    """The answer to one (decompressed, size-checked) export request, its valid spans stored."""
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


def answer_encoded(
    ingest: Pipeline, body: bytes, encoding: str, content_type: str, max_decompressed: int
) -> Answer:
    """Undoes the body's Content-Encoding, then answers it: both CPU work, for a thread."""
    try:
        body = decompress(body, encoding, max_decompressed)
    except BodyError as error:
        return Answer(error.status, error.message)
    return answer(ingest, body, content_type)


class IngestGate:
    """At most `limit` export requests in progress, HTTP and gRPC together: each holds its
    body (up to the body and decompression limits) until its batch is stored."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.refused = 0
        self._slots = threading.BoundedSemaphore(limit)

    @contextmanager
    def admit(self) -> Iterator[Answer | None]:
        """Yields None with a slot held, or the 503 to answer when every slot is taken
        (OTLP exporters retry 503 / UNAVAILABLE after Retry-After)."""
        if not self._slots.acquire(blocking=False):
            self.refused += 1
            yield Answer(
                503,
                f"backend busy: {self.limit} export requests already in progress; retry "
                "(KVSCOPE_BACKEND_MAX_CONCURRENT_INGEST sets how many)",
                retry_after_s=1,
            )
            return
        try:
            yield None
        finally:
            self._slots.release()
