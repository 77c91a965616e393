"""GET /metrics after real OTLP exports, read with prometheus_client's parser: spans received,
stored and dropped, refused requests, ingest latency, a stream's gap, the database's size."""

import time
import uuid

import pytest
from opentelemetry.sdk.trace.export import SpanExportResult
from prometheus_client.parser import text_string_to_metric_families

from .story import Process, load_story

pytestmark = pytest.mark.timeout(60)


def scrape(backend) -> dict[str, list]:
    """{sample name: [(labels, value), ...]}."""
    with backend.client(token="") as client:  # no token: /metrics is open, as vLLM's is
        answer = client.get("/metrics")
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/plain")
    found: dict[str, list] = {}
    for family in text_string_to_metric_families(answer.text):
        for sample in family.samples:
            found.setdefault(sample.name, []).append((sample.labels, sample.value))
    return found


def value(found: dict, name: str, **labels: str) -> float:
    return sum(v for got, v in found.get(name, []) if labels.items() <= got.items())


def test_exports_are_counted_and_a_lost_span_shows_as_a_gap(make_backend):
    backend = make_backend(token="secret")
    engine_id = f"engine-{uuid.uuid4().hex[:6]}"
    scheduler, worker, api = (
        Process("vllm-engine", engine_id, "scheduler"),
        Process("vllm-worker", engine_id, "worker"),
        Process("vllm-api", engine_id, "api"),
    )
    load_story(scheduler, worker, api, "cmpl-1", time.time_ns())
    sent = scheduler.spans()
    lost = sent.pop(1)  # a span the exporter never delivered: a hole in the stream's seq
    assert backend.export(sent + worker.spans()) == SpanExportResult.SUCCESS
    with backend.client() as client:
        refused = client.post(
            "/v1/traces", content=b"\x00garbage", headers={"content-type": "application/x-protobuf"}
        )
    assert refused.status_code == 400 and lost is not None
    found = scrape(backend)
    spans = len(sent) + len(worker.spans())
    assert value(found, "kvscope_backend_spans_received_total") == spans
    assert value(found, "kvscope_backend_spans_stored_total") == spans
    assert value(found, "kvscope_backend_export_requests_total", outcome="stored") == 1
    assert value(found, "kvscope_backend_export_requests_total", outcome="malformed") == 1
    assert value(found, "kvscope_backend_ingest_seconds_count") == 1
    origin = {"origin": scheduler.origin, "service_name": "vllm-engine"}
    assert value(found, "kvscope_backend_stream_spans_received", **origin) == len(sent)
    assert value(found, "kvscope_backend_stream_gaps", state="pending", **origin) == 1
    assert value(found, "kvscope_backend_stream_missing_spans", **origin) == 1
    assert value(found, "kvscope_backend_stream_missing_spans", origin=worker.origin) == 0
    assert value(found, "kvscope_backend_database_bytes") > 0


def test_each_app_counts_only_its_own_exports(make_backend):
    first, second = make_backend(), make_backend()
    process = Process("vllm-engine", "e", "scheduler")
    with process.tracer.start_as_current_span("kvscope.hook.x"):
        pass
    assert first.export(process.spans()) == SpanExportResult.SUCCESS
    assert value(scrape(first), "kvscope_backend_spans_stored_total") == 1
    assert value(scrape(second), "kvscope_backend_spans_stored_total") == 0


@pytest.mark.parametrize("spans", [3, 40], ids=["few rows", "copied rows"])
def test_a_retried_batch_is_received_again_but_stored_once(make_backend, spans):
    """An exporter that timed out on a batch the backend did store sends it again: its spans
    count as received twice, as stored once (/metrics and /health alike). PostgreSQL writes
    40 spans through COPY and a staging table, 3 with one INSERT."""
    backend = make_backend()
    process = Process("vllm-engine", "e", "scheduler")
    for _ in range(spans):
        with process.tracer.start_as_current_span("kvscope.hook.x"):
            pass
    batch = process.spans()
    assert backend.export(batch) == SpanExportResult.SUCCESS
    assert backend.export(batch) == SpanExportResult.SUCCESS  # the retry: accepted, not stored
    with process.tracer.start_as_current_span("kvscope.hook.y"):
        pass
    assert backend.export(batch + process.spans()[-1:]) == SpanExportResult.SUCCESS  # one new
    found = scrape(backend)
    assert value(found, "kvscope_backend_spans_received_total") == 3 * spans + 1
    assert value(found, "kvscope_backend_spans_stored_total") == spans + 1
    assert value(found, "kvscope_backend_export_requests_total", outcome="stored") == 3
    with backend.client() as client:
        health = client.get("/health").json()
    assert health["spans_stored_since_start"] == spans + 1
