"""Sets up the OpenTelemetry SDK for a kvscope process: resource, sequence numbers, exporters."""

import logging
import os
import threading
import time
import uuid

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter

from kvscope.traces import names
from kvscope.traces.sdk.exporters import OtlpGrpcExporter, OtlpHttpExporter, OtlpJsonFileExporter
from kvscope.traces.sdk.processors import (
    BoundedBatchProcessor,
    ExportCounters,
    SequenceProcessor,
    SystemRandomIdGenerator,
)
from kvscope.traces.sdk.settings import Destination, TracingSettings

logger = logging.getLogger(__name__)
_lock = threading.Lock()
_processors: list[BoundedBatchProcessor] = []
_sequence: SequenceProcessor | None = None
_configured = False
TELEMETRY_INTERVAL_S = float(os.environ.get("KVSCOPE_TELEMETRY_INTERVAL_S", 10))
"""How often a process reports its span counts in a kvscope.telemetry span."""


def make_exporter(destination: Destination, backend_token: str | None = None) -> SpanExporter:
    """The SDK exporter for one destination; only the kvscope backend gets `backend_token`.

    Every OTLP destination also gets OTEL_EXPORTER_OTLP_[TRACES_]HEADERS (the exporters read them).
    """
    headers = backend_headers(backend_token) if destination.is_backend else {}
    if destination.protocol == "grpc":
        insecure = destination.endpoint.startswith("http://")
        return OtlpGrpcExporter(endpoint=destination.endpoint, insecure=insecure, headers=headers)
    if destination.protocol == "http/protobuf":
        return OtlpHttpExporter(destination.endpoint, headers=headers)
    if destination.protocol == "http/json":
        return OtlpHttpExporter(destination.endpoint, headers=headers, encoding="json")
    if destination.protocol == "file":
        return OtlpJsonFileExporter(destination.endpoint)
    raise ValueError(f"unknown OTLP protocol {destination.protocol!r}")


def backend_headers(token: str | None) -> dict[str, str]:
    """What the backend checks; lower-case, as gRPC metadata must be (HTTP ignores case)."""
    return {"authorization": f"Bearer {token}"} if token else {}


def _destinations(settings: TracingSettings, joined: bool) -> list[Destination]:
    destinations = list(settings.destinations)
    if joined:
        # A provider set up before us (vLLM's, for --otlp-traces-endpoint) already exports every
        # span, ours included, to the standard endpoint: vLLM writes its endpoint there.
        destinations = [d for d in destinations if not d.standard]
    if settings.backend_token and not any(d.is_backend for d in destinations):
        logger.warning(
            "KVSCOPE_BACKEND_TOKEN is set but no destination is the kvscope backend, so no "
            "destination gets it: set KVSCOPE_BACKEND_URL (or KVSCOPE_BACKEND_GRPC_URL) to the "
            "backend's address, e.g. http://127.0.0.1:4318"
        )
    return destinations


def configure_tracing(
    settings: TracingSettings | None = None,
    service_name: str = "kvscope",
    exporters: list[SpanExporter] | None = None,
    attributes: dict[str, str] | None = None,
) -> bool:
    """Sends this process's spans to the configured destinations; once per process.

    Creates the global tracer provider, or joins the one vLLM set up for its own tracing (so
    vLLM's `llm_request` spans reach our destinations too). Returns False and changes nothing
    when tracing is disabled, nothing would receive spans, or it already ran: set-up twice is
    harmless.
    """
    global _configured, _sequence
    settings = settings or TracingSettings.from_env()
    with _lock:
        if _configured or not settings.enabled:
            return False
        current = trace.get_tracer_provider()
        joined = isinstance(current, TracerProvider)
        exporters = list(exporters or []) + [
            make_exporter(d, settings.backend_token) for d in _destinations(settings, joined)
        ]
        if not exporters and not joined:  # a joined provider exports our spans itself
            return False
        origin = uuid.uuid4().hex
        if isinstance(current, TracerProvider):  # joined
            provider = current
        else:
            provider = TracerProvider(
                resource=_resource(settings, service_name, origin, attributes)
            )
            trace.set_tracer_provider(provider)
        # Tracers made from now on (ours included) draw ids that vLLM's seeding cannot repeat.
        # opentelemetry-sdk leaves TracerProvider.id_generator unannotated: mypy takes the type
        # of its default (RandomIdGenerator) for it, where the SDK accepts any IdGenerator.
        provider.id_generator = SystemRandomIdGenerator()  # type: ignore[assignment]
        _sequence = SequenceProcessor(origin)
        provider.add_span_processor(_sequence)
        for exporter in exporters:
            provider.add_span_processor(_batch(exporter, settings))
        _configured = True
        threading.Thread(target=_report_telemetry, name="kvscope-telemetry", daemon=True).start()
        logger.info("kvscope tracing to %s", [type(e).__name__ for e in exporters])
        return True


def add_exporter(exporter: SpanExporter, settings: TracingSettings | None = None) -> bool:
    """Sends this process's spans to one more destination too (after configure_tracing)."""
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        return False
    provider.add_span_processor(_batch(exporter, settings or TracingSettings.from_env()))
    return True


def _resource(
    settings: TracingSettings, service_name: str, origin: str, attributes: dict[str, str] | None
) -> Resource:
    return Resource.create(
        {
            "service.name": settings.service_name or service_name,
            names.PROCESS_ID: origin,
            names.SCHEMA: names.SCHEMA_VERSION,
            **(attributes or {}),
        }
    )


def _batch(exporter: SpanExporter, settings: TracingSettings) -> SpanProcessor:
    processor = BoundedBatchProcessor(
        exporter, settings.max_queue_size, settings.max_batch_size, settings.schedule_delay_s
    )
    _processors.append(processor)
    return processor


def export_counters() -> ExportCounters:
    """Totals over this process's exporters: queued, exported and dropped spans."""
    total = ExportCounters()
    for processor in _processors:
        for key, value in vars(processor.counters).items():
            setattr(total, key, getattr(total, key) + value)
    return total


def emit_telemetry() -> None:
    """A kvscope.telemetry span: spans ended so far here, and spans lost on any destination."""
    if _sequence is None:
        return
    tracer = trace.get_tracer(names.INSTRUMENTATION_NAME)
    # Counted before this span ends, so a receiver compares like with like.
    emitted, dropped = _sequence.ended + 1, export_counters().dropped
    attributes = {names.SPANS_EMITTED: emitted, names.SPANS_DROPPED: dropped}
    tracer.start_span(names.SPAN_TELEMETRY, attributes=attributes).end()


def _report_telemetry() -> None:
    while True:
        time.sleep(TELEMETRY_INTERVAL_S)
        emit_telemetry()


def flush(timeout_s: float = 10) -> bool:
    """Reports telemetry, then exports what is queued; for tests and clean shutdown."""
    emit_telemetry()
    provider = trace.get_tracer_provider()
    return isinstance(provider, TracerProvider) and provider.force_flush(int(timeout_s * 1000))
