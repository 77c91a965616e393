"""Span exporters kvscope adds to the SDK's: OTLP/HTTP and gRPC with the direct protobuf encoder,
and OTLP/JSON lines in a file shared by processes."""

import fcntl
import gzip
import logging
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TypedDict
from urllib.parse import urlsplit
from urllib.request import getproxies, proxy_bypass

import urllib3
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.util.re import parse_env_headers

from kvscope.traces.sdk.otlp_json import spans_to_otlp_json
from kvscope.traces.sdk.otlp_proto import encode_spans

logger = logging.getLogger(__name__)

RETRYABLE_STATUS = frozenset({429, 502, 503, 504})
"""HTTP answers the OTLP spec says to retry (with back-off); every other error is final."""

CONTENT_TYPES = {"protobuf": "application/x-protobuf", "json": "application/json"}


def _env(name: str) -> str | None:
    """OTEL_EXPORTER_OTLP_TRACES_<name>, else OTEL_EXPORTER_OTLP_<name>, as the spec orders."""
    return os.environ.get(f"OTEL_EXPORTER_OTLP_TRACES_{name}") or os.environ.get(
        f"OTEL_EXPORTER_OTLP_{name}"
    )


DEFAULT_TIMEOUT_S = 10.0
"""How long a batch is retried when neither the caller nor the environment says."""


def timeout_from_env() -> float:
    """OTEL_EXPORTER_OTLP_[TRACES_]TIMEOUT in seconds, as OpenTelemetry Python's own OTLP
    exporters read it (the spec's milliseconds are not what Python users set); a value that is
    not a positive number is named in a warning and the default used."""
    raw = _env("TIMEOUT")
    if raw is None:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if value > 0:
        return value
    logger.warning(
        "OTLP exporter timeout %r is not a number of seconds > 0: using %g", raw, DEFAULT_TIMEOUT_S
    )
    return DEFAULT_TIMEOUT_S


class _Tls(TypedDict, total=False):
    """The TLS options connection_pool passes on to urllib3's connection pools."""

    ca_certs: str


def connection_pool(endpoint: str, certificate: str | None = None) -> urllib3.PoolManager:
    """Kept-alive connections to one endpoint, through the proxy the environment names for it
    (HTTP(S)_PROXY and NO_PROXY, as the SDK's exporter honours them)."""
    url = urlsplit(endpoint)
    proxy = None if proxy_bypass(url.hostname or "") else getproxies().get(url.scheme)
    tls: _Tls = {"ca_certs": certificate} if certificate else {}
    if proxy:
        return urllib3.ProxyManager(proxy, num_pools=1, maxsize=1, **tls)
    return urllib3.PoolManager(num_pools=1, maxsize=1, **tls)


class OtlpHttpExporter(SpanExporter):
    """OTLP/HTTP: POSTs each batch (protobuf by default, or JSON), gzip when configured.

    Reads the standard OTEL_EXPORTER_OTLP_[TRACES_]HEADERS, _COMPRESSION, _CERTIFICATE and
    _TIMEOUT variables. Retries a refused connection or a 429/502/503/504 with doubling back-off
    until `timeout_s` (else the environment's timeout, else 10 s) has passed; then the batch
    fails (the batch processor counts it as dropped).
    Posts go through urllib3 on a kept-alive connection: a post costs the export thread, which
    shares the GIL with the engine, about a third of the CPU time `requests` takes.
    """

    def __init__(
        self,
        endpoint: str,
        headers: dict[str, str] | None = None,
        timeout_s: float | None = None,
        encoding: str = "protobuf",
    ) -> None:
        if encoding not in CONTENT_TYPES:
            raise ValueError(f"OTLP/HTTP encoding {encoding!r}: use one of {list(CONTENT_TYPES)}")
        self.endpoint = endpoint
        self.encoding = encoding
        self._timeout_s = timeout_s if timeout_s is not None else timeout_from_env()
        self._gzip = (_env("COMPRESSION") or "none").lower() == "gzip"
        self._headers = dict(parse_env_headers(_env("HEADERS") or "", liberal=True))
        self._headers.update({"Content-Type": CONTENT_TYPES[encoding], **(headers or {})})
        if self._gzip:
            self._headers["Content-Encoding"] = "gzip"
        self._pool = connection_pool(endpoint, _env("CERTIFICATE"))
        self._stopping = threading.Event()
        self._last_warning = 0.0

    def _body(self, spans: Sequence[ReadableSpan]) -> bytes:
        if self.encoding == "protobuf":
            body = encode_spans(spans)
        else:
            body = spans_to_otlp_json(spans).encode()
        return gzip.compress(body, compresslevel=6) if self._gzip else body

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        body = self._body(spans)
        deadline = time.monotonic() + self._timeout_s
        delay = 0.5
        while not self._stopping.is_set():
            remaining = deadline - time.monotonic()
            try:
                response = self._pool.request(
                    "POST",
                    self.endpoint,
                    body=body,
                    headers=self._headers,
                    timeout=urllib3.Timeout(total=max(remaining, 0.1)),
                    retries=False,  # retried here, with back-off
                )
            except (urllib3.exceptions.HTTPError, OSError) as error:
                problem = f"{type(error).__name__}"
            else:
                if 200 <= response.status < 300:
                    return SpanExportResult.SUCCESS
                problem = f"HTTP {response.status}"
                if response.status not in RETRYABLE_STATUS:
                    break
            if time.monotonic() + delay > deadline:
                break
            self._stopping.wait(delay)
            delay *= 2
        else:
            problem = "exporter shut down"
        self._warn(f"{len(spans)} spans not delivered to {self.endpoint}: {problem}")
        return SpanExportResult.FAILURE

    def _warn(self, message: str) -> None:
        # At most one line a minute: a collector that is down must not flood the engine's log.
        now = time.monotonic()
        if now - self._last_warning >= 60:
            self._last_warning = now
            logger.warning("%s (further failures within a minute are counted, not logged)", message)

    def shutdown(self) -> None:
        self._stopping.set()
        self._pool.clear()


class OtlpJsonHttpExporter(OtlpHttpExporter):
    """OTLP/HTTP with the JSON encoding."""

    def __init__(
        self, endpoint: str, headers: dict[str, str] | None = None, timeout_s: float | None = None
    ):
        super().__init__(endpoint, headers=headers, timeout_s=timeout_s, encoding="json")


class OtlpGrpcExporter(OTLPSpanExporter):
    """The SDK's OTLP/gRPC exporter (retries, channel, TLS as it does them), given requests built
    by the direct encoder: parsing bytes is cheap, building messages is not.

    Metadata: OTEL_EXPORTER_OTLP_[TRACES_]HEADERS, then `headers`, keys lower-cased. The SDK's
    exporter would drop the variables whenever headers are given, and gRPC fails every call
    whose metadata has an upper-case key ("Illegal header key").
    """

    def __init__(
        self, endpoint: str | None = None, headers: dict[str, str] | None = None, **kwargs
    ) -> None:
        metadata = dict(parse_env_headers(_env("HEADERS") or "", liberal=True))
        metadata.update((key.lower(), value) for key, value in (headers or {}).items())
        super().__init__(endpoint=endpoint, headers=metadata or None, **kwargs)

    def _translate_data(self, data: Sequence[ReadableSpan]) -> ExportTraceServiceRequest:
        return ExportTraceServiceRequest.FromString(encode_spans(data))


class OtlpJsonFileExporter(SpanExporter):
    """Appends each batch as one OTLP/JSON line; several processes may share one file.

    The lines are what `POST /v1/traces` accepts, so a recording can be replayed into the backend.
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        line = spans_to_otlp_json(spans) + "\n"
        try:
            with open(self.path, "a", encoding="utf-8") as out:
                # One lock per line keeps lines from two processes whole.
                fcntl.flock(out, fcntl.LOCK_EX)
                out.write(line)
        except OSError:
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None
