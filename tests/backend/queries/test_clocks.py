"""Clock offsets: a host whose clock runs ahead is estimated as such, and the mix is flagged."""

import time

import pytest
from opentelemetry.sdk.trace.export import SpanExportResult

from kvscope.backend.queries.clocks import MIN_SAMPLES

from ..story import MS, Process

pytestmark = pytest.mark.timeout(60)


def _spans_now(process: Process, count: int, ahead_ns: int = 0) -> list:
    """Spans that end now on a clock `ahead_ns` ahead of this one."""
    for _ in range(count):
        at_ns = time.time_ns() + ahead_ns
        process.hook("get_num_new_matched_tokens", None, at_ns - MS, at_ns)
    return process.spans()


def _clocks(backend, **params) -> dict:
    with backend.client() as client:
        response = client.get("/api/v1/clocks", params=params)
        assert response.status_code == 200, response.text
        return response.json()


def test_a_host_clock_two_seconds_ahead_is_estimated_and_flagged(make_backend):
    backend = make_backend()
    prefill = Process("vllm-prefill", "engine-p", "scheduler")
    decode = Process("vllm-decode", "engine-d", "scheduler")
    assert backend.export(_spans_now(prefill, MIN_SAMPLES)) == SpanExportResult.SUCCESS
    spans = _spans_now(decode, MIN_SAMPLES, ahead_ns=2000 * MS)
    assert backend.export(spans) == SpanExportResult.SUCCESS
    found = _clocks(backend)
    offsets = {p["engine_id"]: p["offset_ms"] for p in found["processes"]}
    # The estimate is a lower bound: it misses the export delay (here the exporter's start
    # and a busy 2-core machine: up to a few hundred ms).
    assert -1000 < offsets["engine-p"] <= 0
    assert 1000 < offsets["engine-d"] <= 2000
    assert found["mixed"] is True and 1000 < found["spread_ms"] < 3000
    assert all(p["trusted"] and p["service_name"] for p in found["processes"])
    assert _clocks(backend, threshold_ms=5000)["mixed"] is False


def test_one_host_is_not_flagged_and_a_quiet_process_is_not_trusted(make_backend):
    backend = make_backend()
    busy = Process("vllm-prefill", "engine-p", "scheduler")
    quiet = Process("vllm-decode", "engine-d", "scheduler")
    assert backend.export(_spans_now(busy, MIN_SAMPLES)) == SpanExportResult.SUCCESS
    assert backend.export(_spans_now(quiet, 1, ahead_ns=-3000 * MS)) == SpanExportResult.SUCCESS
    found = _clocks(backend)
    trusted = {p["engine_id"]: p["trusted"] for p in found["processes"]}
    assert trusted == {"engine-p": True, "engine-d": False}
    assert found["mixed"] is False and found["spread_ms"] is None
