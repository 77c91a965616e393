"""Tier health: kvscope.tier.health spans from the real emitter, over OTLP, served per tier."""

import time
import uuid

import pytest
from opentelemetry.sdk.trace.export import SpanExportResult

from kvscope.traces import names

from ..story import MS, Process

pytestmark = pytest.mark.timeout(60)


def _tier_span(process: Process, at_ns: int, tier: str, state: str, **extra) -> None:
    """A root span as connector/common/tier_health.emit_state_span makes it: no engine id on
    the span itself (the process's other spans name the engine)."""
    attributes = {
        names.TIER: tier,
        names.TIER_STATE: state,
        names.TIER_REASON: extra.get("reason", ""),
        names.TIER_FAILURES: extra.get("failures", 0),
        names.TIER_BYPASS_S: float(extra.get("bypass_s", 0.0)),
    }
    span = process.tracer.start_span(
        names.SPAN_TIER_HEALTH, start_time=at_ns, attributes=attributes
    )
    span.end(end_time=at_ns)


def _tiers(backend) -> list[dict]:
    with backend.client() as client:
        response = client.get("/api/v1/tiers")
        assert response.status_code == 200, response.text
        return response.json()


def _bypassed_in_summary(backend) -> int:
    with backend.client() as client:
        response = client.get("/api/v1/stats/summary")
        assert response.status_code == 200, response.text
        return response.json()["tiers_bypassed"]


def test_latest_state_per_engine_and_tier_with_since(backend):
    engine_id = f"engine-{uuid.uuid4().hex[:6]}"
    bypassed_before = _bypassed_in_summary(backend)
    scheduler = Process("vllm-decode", engine_id, "scheduler")
    t0 = time.time_ns() - 60_000 * MS
    scheduler.hook("get_num_new_matched_tokens", None, t0, t0 + MS)  # names the engine
    _tier_span(
        scheduler,
        t0 + 1 * MS,
        "cpu_offload",
        "bypassed",
        reason="timeout",
        failures=3,
        bypass_s=5.0,
    )
    _tier_span(scheduler, t0 + 2 * MS, "cpu_offload", "probing", bypass_s=5.0)
    _tier_span(
        scheduler,
        t0 + 3 * MS,
        "cpu_offload",
        "bypassed",
        reason="load failed: boom",
        failures=4,
        bypass_s=10.0,
    )
    _tier_span(scheduler, t0 + 4 * MS, "p2p:10.0.0.2:5600", "healthy")
    assert backend.export(scheduler.spans()) == SpanExportResult.SUCCESS
    mine = [t for t in _tiers(backend) if t["engine_id"] == engine_id]
    assert [(t["tier"], t["state"]) for t in mine] == [
        ("cpu_offload", "bypassed"),  # bypassed first: what an operator must see
        ("p2p:10.0.0.2:5600", "healthy"),
    ]
    offload = mine[0]
    assert offload["reason"] == "load failed: boom" and offload["failures"] == 4
    assert offload["service_name"] == "vllm-decode"
    assert offload["since_ns"] == t0 + 3 * MS  # the bypass began again after the probe
    assert offload["bypassed_until_ns"] == t0 + 3 * MS + 10_000 * MS
    assert _bypassed_in_summary(backend) == bypassed_before + 1  # the overview's count


def test_a_tier_healthy_again_is_healthy_and_arrival_order_does_not_matter(backend):
    engine_id = f"engine-{uuid.uuid4().hex[:6]}"
    scheduler = Process("vllm-prefill", engine_id, "scheduler")
    t0 = time.time_ns()
    scheduler.hook("get_num_new_matched_tokens", None, t0, t0 + MS)
    _tier_span(scheduler, t0 + 1 * MS, "cpu_offload", "bypassed", reason="timeout", bypass_s=1)
    _tier_span(scheduler, t0 + 2 * MS, "cpu_offload", "probing")
    _tier_span(scheduler, t0 + 3 * MS, "cpu_offload", "healthy", reason="probe loaded")
    spans = scheduler.spans()
    # The newest change arrives first, the older ones in a later export.
    assert backend.export([spans[0], spans[-1]]) == SpanExportResult.SUCCESS
    assert backend.export(spans[1:-1]) == SpanExportResult.SUCCESS
    [offload] = [t for t in _tiers(backend) if t["engine_id"] == engine_id]
    assert (offload["state"], offload["reason"]) == ("healthy", "probe loaded")
    assert offload["since_ns"] == t0 + 3 * MS and offload["bypassed_until_ns"] is None


def test_the_connectors_own_emitter_reaches_the_tiers_route(backend, spans):
    """Spans from connector/common/tier_health and traces.spans in this process's real tracer:
    the tier span names no engine, the process's hook span does."""
    from kvscope.connector.common.tier_health import TierState, emit_state_span
    from kvscope.traces.hook_spans import HookSpans

    engine_id = f"engine-{uuid.uuid4().hex[:6]}"
    hooks = HookSpans("CpuOffloadConnector", "scheduler", engine_id, "kv_both")
    with hooks.hook("get_num_new_matched_tokens"):
        pass
    emit_state_span("cpu_offload", TierState.BYPASSED, "timeout", 3, 2.5)
    assert backend.export(spans()) == SpanExportResult.SUCCESS
    [offload] = [t for t in _tiers(backend) if t["engine_id"] == engine_id]
    assert (offload["tier"], offload["state"], offload["failures"]) == (
        "cpu_offload",
        "bypassed",
        3,
    )
    assert offload["bypassed_until_ns"] == offload["since_ns"] + 2_500_000_000
