"""Collects this process's finished spans in memory, where the scenario checks read them."""

from typing import Any


class SpanCollector:
    """An in-memory exporter beside any other destination of kvscope's tracing."""

    _shared: "SpanCollector | None" = None

    def __init__(self, exporter: Any) -> None:
        self.exporter = exporter

    @classmethod
    def attach(cls) -> "SpanCollector":
        """Sets tracing up with an in-memory exporter, or adds one to tracing already set up
        (once per process: later calls return the same collector)."""
        if cls._shared is not None:
            return cls._shared
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        from kvscope.traces.sdk.configure import add_exporter, configure_tracing
        from kvscope.traces.sdk.settings import TracingSettings

        exporter = InMemorySpanExporter()
        settings = TracingSettings(schedule_delay_s=0.05, max_queue_size=65536)
        configured = configure_tracing(
            settings, service_name="kvscope-verify", exporters=[exporter]
        )
        if not configured and not add_exporter(exporter, settings):
            raise RuntimeError(
                "kvscope tracing is disabled here (KVSCOPE_TRACING?): "
                "verify reads the connector's hook spans; enable it"
            )
        cls._shared = cls(exporter)
        return cls._shared

    def clear(self) -> None:
        self.flush()
        self.exporter.clear()

    def flush(self) -> None:
        from kvscope.traces.sdk.configure import flush

        flush()

    def collect(self) -> list[Any]:
        self.flush()
        return list(self.exporter.get_finished_spans())
