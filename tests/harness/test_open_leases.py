"""harness/leaks.open_leases, the check of a scheduler in another process: leases its spans show
acquired and never released nor expired, per process, read from the file kvscope's exporter
writes (the real OpenTelemetry SDK and OTLP/JSON encoder)."""

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from kvscope.harness.leaks import open_leases
from kvscope.traces import names
from kvscope.traces.sdk.exporters import OtlpJsonFileExporter


def write_lease_spans(path, events: list[tuple[str, str, int]]) -> None:
    """One span per (process origin, lease event name, lease id), exported to path."""
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(OtlpJsonFileExporter(path)))
    tracer = provider.get_tracer("test")
    for origin, event, lease_id in events:
        with tracer.start_as_current_span("hook", attributes={names.SEQ_ORIGIN: origin}) as span:
            span.add_event(event, {names.LEASE_ID: lease_id})
    provider.shutdown()


def test_a_lease_released_or_expired_is_closed_and_one_never_ended_is_named(tmp_path):
    spans_file = tmp_path / "spans.jsonl"
    write_lease_spans(
        spans_file,
        [
            ("engine-a", names.EVENT_LEASE_ACQUIRED, 1),
            ("engine-a", names.EVENT_LEASE_RELEASED, 1),
            ("engine-a", names.EVENT_LEASE_ACQUIRED, 2),
            ("engine-a", names.EVENT_LEASE_EXPIRED, 2),
            # Lease ids count per process: engine-b's lease 1 is another lease, still held.
            ("engine-b", names.EVENT_LEASE_ACQUIRED, 1),
        ],
    )
    assert open_leases(spans_file, wait_s=0) == [
        "spans: lease ('engine-b', 1) acquired, never released"
    ]


def test_spans_that_close_every_lease_report_nothing(tmp_path):
    spans_file = tmp_path / "spans.jsonl"
    write_lease_spans(
        spans_file,
        [("engine-a", names.EVENT_LEASE_ACQUIRED, 7), ("engine-a", names.EVENT_LEASE_RELEASED, 7)],
    )
    assert open_leases(spans_file, wait_s=0) == []
    assert open_leases(tmp_path / "never-written.jsonl", wait_s=0) == []
