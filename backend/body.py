"""Reads an ingest request body within size limits and undoes gzip or deflate, also bounded."""

import zlib

from starlette.requests import Request

from kvscope.backend.otlp import JSON, PROTOBUF


class BodyError(ValueError):
    """The body cannot be read; status is the HTTP code to answer with."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


def content_type_of(request: Request) -> str:
    """The OTLP encoding the request names, or BodyError 415 with what to send instead."""
    media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media_type in (PROTOBUF, JSON):
        return media_type
    raise BodyError(
        415,
        f"unsupported content type {media_type or '(none)'!r}: send OTLP traces as "
        f"{PROTOBUF} or {JSON}",
    )


async def read_body(request: Request, max_bytes: int, max_decompressed: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise BodyError(400, f"invalid Content-Length {declared!r}")
        if int(declared) > max_bytes:
            raise BodyError(413, _too_large(int(declared), max_bytes))
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise BodyError(413, _too_large(size, max_bytes))
        chunks.append(chunk)
    return decompress(
        b"".join(chunks), request.headers.get("content-encoding", ""), max_decompressed
    )


def _too_large(size: int, limit: int) -> str:
    return (
        f"body of {size} bytes or more exceeds the limit of {limit} bytes: export smaller "
        "batches (OTel BatchSpanProcessor max_export_batch_size) or raise "
        "KVSCOPE_BACKEND_MAX_BODY_BYTES"
    )


def decompress(body: bytes, encoding: str, max_bytes: int) -> bytes:
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding == "gzip":
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    elif encoding == "deflate":
        inflater = zlib.decompressobj()
    else:
        raise BodyError(
            415, f"unsupported Content-Encoding {encoding!r}: use gzip, deflate or none"
        )
    try:
        # max_length bounds the output: a small bomb cannot expand into gigabytes.
        data = inflater.decompress(body, max_bytes + 1)
    except zlib.error as error:
        raise BodyError(400, f"body is not valid {encoding} data: {error}") from None
    if len(data) > max_bytes or inflater.unconsumed_tail:
        raise BodyError(
            413,
            f"body expands beyond {max_bytes} bytes once decompressed: "
            "export smaller batches or raise "
            "KVSCOPE_BACKEND_MAX_DECOMPRESSED_BYTES",
        )
    if not inflater.eof:
        raise BodyError(400, f"body is truncated {encoding} data")
    return data
