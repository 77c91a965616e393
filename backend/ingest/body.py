"""Reads an ingest request body within size limits and undoes gzip or deflate, also bounded."""

import zlib

from starlette.requests import Request

PROTOBUF = "application/x-protobuf"
JSON = "application/json"


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


async def read_body(request: Request, max_bytes: int) -> bytes:
    """The body as sent (still compressed), at most max_bytes; decompress() undoes its
    encoding, in a thread: inflating 64 MiB on the event loop would stall every client."""
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
    return b"".join(chunks)


def _too_large(size: int, limit: int) -> str:
    return (
        f"body of {size} bytes or more exceeds the limit of {limit} bytes: export smaller "
        "batches (OTel BatchSpanProcessor max_export_batch_size) or raise "
        "KVSCOPE_BACKEND_MAX_BODY_BYTES"
    )


def decompress(body: bytes, encoding: str, max_bytes: int) -> bytes:
    """The body with its Content-Encoding undone, at most max_bytes; BodyError otherwise.
    Every gzip member is read (RFC 1952 allows several); bytes after the last are refused."""
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding not in ("gzip", "deflate"):
        raise BodyError(
            415, f"unsupported Content-Encoding {encoding!r}: use gzip, deflate or none"
        )
    wbits = 16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS
    parts: list[bytes] = []
    size, rest = 0, body
    while len(parts) < MAX_MEMBERS:
        data, rest = _inflate_one(rest, wbits, encoding, max_bytes - size, max_bytes)
        parts.append(data)
        size += len(data)
        if not rest:
            return b"".join(parts)
        if encoding == "deflate" or rest[:2] != _GZIP_MAGIC:
            raise BodyError(400, f"body has {len(rest)} bytes after the end of its {encoding} data")
    raise BodyError(400, f"body has more than {MAX_MEMBERS} gzip members: send one")


MAX_MEMBERS = 64
"""gzip members per body: exporters send one; thousands of empty ones only cost CPU."""


_GZIP_MAGIC = b"\x1f\x8b"


def _inflate_one(
    data: bytes, wbits: int, encoding: str, room: int, limit: int
) -> tuple[bytes, bytes]:
    """One complete gzip member (or deflate stream) of at most `room` bytes, and what follows."""
    inflater = zlib.decompressobj(wbits)
    try:
        # max_length bounds the output: a small bomb cannot expand into gigabytes.
        out = inflater.decompress(data, room + 1)
    except zlib.error as error:
        raise BodyError(400, f"body is not valid {encoding} data: {error}") from None
    if len(out) > room or inflater.unconsumed_tail:
        raise BodyError(
            413,
            f"body expands beyond {limit} bytes once decompressed: export smaller batches "
            "or raise KVSCOPE_BACKEND_MAX_DECOMPRESSED_BYTES",
        )
    if not inflater.eof:
        raise BodyError(400, f"body is truncated {encoding} data")
    return out, inflater.unused_data
