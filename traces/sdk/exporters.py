"""Span exporters kvscope adds to the SDK's own: OTLP/JSON lines in a file, shared by processes."""

import fcntl
import os
from collections.abc import Sequence
from pathlib import Path

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from kvscope.traces.sdk.otlp_json import spans_to_otlp_json


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


class OtlpJsonHttpExporter(SpanExporter):
    """OTLP/HTTP with the JSON encoding (the SDK's own HTTP exporter speaks protobuf only)."""

    def __init__(self, endpoint: str, headers: dict[str, str] | None = None, timeout_s: float = 10):
        import requests  # the SDK's HTTP exporter depends on it already

        self.endpoint = endpoint
        self._session = requests.Session()
        self._session.headers.update({"Content-Type": "application/json", **(headers or {})})
        self._timeout_s = timeout_s

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            response = self._session.post(
                self.endpoint, data=spans_to_otlp_json(spans), timeout=self._timeout_s
            )
        except OSError:
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS if response.ok else SpanExportResult.FAILURE

    def shutdown(self) -> None:
        self._session.close()
