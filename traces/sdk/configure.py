"""Sets up the OpenTelemetry SDK for a kvscope process: resource, sequence numbers, exporters."""

import logging
import os
import threading
import uuid

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter

from kvscope.traces import names
from kvscope.traces.sdk.exporters import OtlpJsonFileExporter, OtlpJsonHttpExporter
from kvscope.traces.sdk.processors import BoundedBatchProcessor, ExportCounters, SequenceProcessor
from kvscope.traces.sdk.settings import Destination, TracingSettings

logger = logging.getLogger(__name__)
_lock = threading.Lock()
_processors: list[BoundedBatchProcessor] = []
_configured = False


def make_exporter(destination: Destination) -> SpanExporter:
    """The SDK exporter for one destination."""
    headers = _headers()
    if destination.protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        insecure = destination.endpoint.startswith("http://")
        return OTLPSpanExporter(endpoint=destination.endpoint, insecure=insecure, headers=headers)
    if destination.protocol == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter(endpoint=destination.endpoint, headers=headers)
    if destination.protocol == "http/json":
        return OtlpJsonHttpExporter(destination.endpoint, headers=headers)
    if destination.protocol == "file":
        return OtlpJsonFileExporter(destination.endpoint)
    raise ValueError(f"unknown OTLP protocol {destination.protocol!r}")


def _headers() -> dict[str, str]:
    # OTEL_EXPORTER_OTLP_HEADERS is read by the SDK exporters themselves; kvscope adds its token.
    token = os.environ.get("KVSCOPE_BACKEND_TOKEN")
    return {"Authorization": f"Bearer {token}"} if token else {}


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
    global _configured
    settings = settings or TracingSettings.from_env()
    with _lock:
        if _configured or not settings.enabled:
            return False
        exporters = list(exporters or []) + [make_exporter(d) for d in settings.destinations]
        if not exporters:
            return False
        origin = uuid.uuid4().hex
        provider = trace.get_tracer_provider()
        if not isinstance(provider, TracerProvider):
            provider = TracerProvider(
                resource=_resource(settings, service_name, origin, attributes)
            )
            trace.set_tracer_provider(provider)
        provider.add_span_processor(SequenceProcessor(origin))
        for exporter in exporters:
            provider.add_span_processor(_batch(exporter, settings))
        _configured = True
        logger.info("kvscope tracing to %s", [type(e).__name__ for e in exporters])
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


def flush(timeout_s: float = 10) -> bool:
    """Exports what is queued; for tests and clean shutdown."""
    provider = trace.get_tracer_provider()
    return isinstance(provider, TracerProvider) and provider.force_flush(int(timeout_s * 1000))
