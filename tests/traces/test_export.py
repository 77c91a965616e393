"""Export pipeline: OTEL_* settings, bounded queues that drop and count, dead endpoints."""

import json
import socket
import subprocess
import sys
import threading

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from kvscope.demo.quickstart import traced_example_config
from kvscope.harness.engine import engine_env
from kvscope.harness.prompts import DISTINCT
from kvscope.traces.sdk.processors import BoundedBatchProcessor
from kvscope.traces.sdk.settings import Destination, TracingSettings, parse_endpoint


class BlockedExporter(SpanExporter):
    """Exports nothing until released: stands in for a collector that stopped answering."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.exported = 0

    def export(self, spans):
        self.release.wait(30)
        self.exported += len(spans)
        return SpanExportResult.SUCCESS


def test_full_queue_drops_and_counts_without_waiting():
    exporter = BlockedExporter()
    processor = BoundedBatchProcessor(
        exporter, max_queue_size=100, max_batch_size=10, schedule_delay_s=0.01
    )
    provider = TracerProvider()
    provider.add_span_processor(processor)
    tracer = provider.get_tracer("test")
    finished = threading.Event()

    def emit():
        for _ in range(1000):
            tracer.start_span("s").end()
        finished.set()

    threading.Thread(target=emit, daemon=True).start()
    assert finished.wait(10), "span end blocked on a stuck exporter"
    counters = processor.counters
    assert counters.dropped_queue_full >= 1000 - 100 - 10
    exporter.release.set()
    assert processor.force_flush(10_000)
    assert counters.exported == exporter.exported == counters.queued
    assert counters.queued + counters.dropped_queue_full == 1000
    provider.shutdown()


def test_failed_exports_are_counted_as_dropped():
    class Refusing(SpanExporter):
        def export(self, spans):
            return SpanExportResult.FAILURE

    processor = BoundedBatchProcessor(Refusing(), schedule_delay_s=0.01)
    provider = TracerProvider()
    provider.add_span_processor(processor)
    for _ in range(7):
        provider.get_tracer("test").start_span("s").end()
    processor.force_flush(5000)
    assert processor.counters.dropped_export_failed == 7
    provider.shutdown()


def test_settings_read_standard_and_kvscope_variables():
    settings = TracingSettings.from_env(
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318",
            "KVSCOPE_OTLP_ENDPOINTS": "grpc://jaeger:4317, http+json://backend:8000/v1/traces",
            "KVSCOPE_TRACES_FILE": "/tmp/spans.jsonl",
            "OTEL_SERVICE_NAME": "decode",
            "OTEL_BSP_MAX_QUEUE_SIZE": "100",
        }
    )
    assert settings.destinations == (
        Destination("grpc", "http://jaeger:4317"),
        Destination("http/json", "http://backend:8000/v1/traces"),
        Destination("http/protobuf", "http://collector:4318/v1/traces"),
        Destination("file", "/tmp/spans.jsonl"),
    )
    assert settings.service_name == "decode" and settings.max_queue_size == 100


def test_settings_can_switch_tracing_off():
    assert not TracingSettings.from_env({"OTEL_SDK_DISABLED": "true"}).enabled
    assert not TracingSettings.from_env({"KVSCOPE_TRACING": "off"}).enabled
    assert TracingSettings.from_env({}).destinations == ()


@pytest.mark.parametrize("url", ["localhost:4317", "ftp://host/x"])
def test_bad_endpoints_say_what_is_wrong(url):
    with pytest.raises(ValueError, match="scheme"):
        parse_endpoint(url)


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.engine
def test_dead_otlp_endpoint_does_not_stop_generation(tiny_model, tmp_path):
    env = engine_env(
        KVSCOPE_OTLP_ENDPOINTS=f"http://127.0.0.1:{closed_port()}/v1/traces",
        OTEL_EXPORTER_OTLP_TRACES_TIMEOUT="1",
        OTEL_BSP_SCHEDULE_DELAY="100",
        VLLM_ENABLE_V1_MULTIPROCESSING="0",
    )
    config = json.dumps(traced_example_config(tmp_path))
    cmd = [
        sys.executable,
        "-m",
        "kvscope.demo.run_prompts",
        str(tiny_model),
        config,
        DISTINCT[0],
        "--max-tokens",
        "8",
    ]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    tokens_line, telemetry_line = result.stdout.strip().splitlines()[-2:]
    assert len(json.loads(tokens_line)[0][0]) == 8
    telemetry = json.loads(telemetry_line)["telemetry"]
    assert telemetry["exported"] == 0
    assert telemetry["dropped_export_failed"] > 0


def test_span_ids_do_not_repeat_when_vllm_seeds_python_random(span_exporter):
    """vLLM seeds Python's global random (seed 0 by default): ids must not follow it."""
    import random

    from opentelemetry import trace

    ids = []
    for _ in range(2):
        random.seed(0)
        with trace.get_tracer("test").start_as_current_span("after-seed") as span:
            ids.append((span.get_span_context().trace_id, span.get_span_context().span_id))
    assert ids[0] != ids[1]
