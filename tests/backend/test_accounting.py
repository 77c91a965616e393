"""Token accounting over real OTLP exports: per request, the lookup's local and external hits by
tier + the tokens vLLM computed = the prompt; violations per engine in REST and /metrics."""

import json
import time
from pathlib import Path

import pytest

from kvscope.traces import names
from kvscope.traces.hit_rate import PROMQL, hit_rate, pooled

from .queries.test_recomputes import engine_pair, export
from .story import MS, Process
from .test_metrics import scrape, value

pytestmark = pytest.mark.timeout(120)

MULTI = "MultiConnector"
GRAFANA = Path(__file__).parents[2] / "deploy" / "grafana" / "dashboards" / "kvscope.json"


def request_story(
    scheduler: Process,
    req_id: str,
    t0: int,
    prompt: int = 96,
    local: int = 32,
    external: int = 64,
    vllm_cached: tuple[int, int] | None = None,
    children: tuple[tuple[str, str, int], ...] = (),
    connector: str | None = None,
    pending_first: bool = False,
    retried_from: tuple[int, int] | None = None,
) -> None:
    """A request as the traced scheduler half reports it: its span with the prompt length, a
    lookup (pending first, if asked; after one the budget sent back, answered retried_from's
    (local, external); with a Multi's child lookups), the allocation with vLLM's
    own cached counts (default: what the lookup said), the end."""
    base = {names.CONNECTOR_NAME: connector} if connector else {}
    request = scheduler.start(
        names.SPAN_REQUEST, t0, None, **{names.REQUEST_ID: req_id, names.PROMPT_TOKENS: prompt}
    )
    at = t0 + MS
    if pending_first:
        pending = {names.TOKENS_LOCAL_HIT: local, names.TOKENS_EXTERNAL_PENDING: True}
        pending[names.REQUEST_ID] = req_id
        scheduler.hook("get_num_new_matched_tokens", request, at, at + 10, **base, **pending)
        at += MS
    if retried_from is not None:
        earlier = {
            names.TOKENS_LOCAL_HIT: retried_from[0],
            names.TOKENS_EXTERNAL_HIT: retried_from[1],
        }
        earlier[names.REQUEST_ID] = req_id
        scheduler.hook("get_num_new_matched_tokens", request, at, at + 10, **base, **earlier)
        at += MS
    lookup = scheduler.hook(
        "get_num_new_matched_tokens",
        request,
        at,
        at + MS,
        **base,
        **{
            names.REQUEST_ID: req_id,
            names.TOKENS_LOCAL_HIT: local,
            names.TOKENS_EXTERNAL_HIT: external,
        },
    )
    for index, (child, child_class, hit) in enumerate(children):
        scheduler.hook(
            "get_num_new_matched_tokens",
            lookup,
            at + 10 + index,
            at + 20 + index,
            **{
                names.REQUEST_ID: req_id,
                names.CONNECTOR_CHILD: child,
                names.CONNECTOR_NAME: child_class,
                names.TOKENS_LOCAL_HIT: local,
                names.TOKENS_EXTERNAL_HIT: hit,
            },
        )
    vllm_local, vllm_external = vllm_cached if vllm_cached else (local, external)
    scheduler.hook(
        "update_state_after_alloc",
        request,
        at + 3 * MS,
        at + 4 * MS,
        **base,
        **{
            names.REQUEST_ID: req_id,
            names.TOKENS_TO_LOAD: vllm_external,
            names.TOKENS_VLLM_LOCAL_CACHED: vllm_local,
            names.TOKENS_VLLM_EXTERNAL_CACHED: vllm_external,
        },
    )
    request.set_attribute(names.REQUEST_STATUS, "FINISHED_STOPPED")
    request.end(end_time=at + 20 * MS)


def accounting(backend, window_s: float = 3600.0) -> dict:
    with backend.client() as client:
        answer = client.get("/api/v1/stats/accounting", params={"window_s": window_s})
    assert answer.status_code == 200, answer.text
    return answer.json()


def engine_of(found: dict, engine_id: str) -> dict:
    (row,) = [row for row in found["engines"] if row["engine_id"] == engine_id]
    return row


def test_one_hit_rate_definition_pools_tokens_never_averages_ratios():
    assert hit_rate(0, 0) is None and hit_rate(3, 4) == 0.75
    # One long all-hit request and one short miss: 90/100, not the mean of 1.0 and 0.0.
    assert pooled([(90, 90), (0, 10)]) == 0.9


def test_tokens_add_up_per_request_and_engine_by_tier(backend):
    scheduler, _ = engine_pair()
    t0 = time.time_ns() - 60_000 * MS
    request_story(scheduler, "cmpl-host", t0)  # 32 local + 64 host + 0 computed
    request_story(scheduler, "cmpl-miss", t0 + 100 * MS, prompt=40, local=0, external=0)
    request_story(scheduler, "cmpl-pending", t0 + 200 * MS, pending_first=True)
    # Sent back by the budget after a first lookup; vLLM counts the one it scheduled by.
    request_story(scheduler, "cmpl-retried", t0 + 300 * MS, retried_from=(0, 64))
    export(backend, scheduler)
    found = accounting(backend)
    row = engine_of(found, scheduler.engine_id)
    assert row["requests"] == 4 and row["violations"] == 0, found["violations"]
    assert row["prompt_tokens"] == 96 + 40 + 96 + 96
    assert row["local_hit_tokens"] == 96 and row["external_hit_tokens"] == {"host": 192}
    assert row["computed_tokens"] == 40
    assert row["hit_rate"] == pytest.approx((96 + 192) / 328)
    assert found["violations"] == [] and "never a mean" in found["definition"]


def test_a_multi_connectors_hit_is_counted_in_the_tier_of_the_child_that_served(backend):
    scheduler, _ = engine_pair()
    t0 = time.time_ns() - 60_000 * MS
    children = (("offload", "CPUOffloadConnector", 0), ("p2p", "P2PConnector", 64))
    request_story(scheduler, "cmpl-peer", t0, connector=MULTI, children=children)
    export(backend, scheduler)
    row = engine_of(accounting(backend), scheduler.engine_id)
    assert row["external_hit_tokens"] == {"peer": 64} and row["violations"] == 0


def test_counts_that_do_not_add_up_are_named_with_the_request(make_backend):
    backend = make_backend()
    scheduler, _ = engine_pair()
    clean, _ = engine_pair("vllm-clean")
    t0 = time.time_ns() - 3 * 3600 * 1000 * MS  # /metrics has no window
    request_story(scheduler, "cmpl-over", t0, prompt=96, local=64, external=64)
    request_story(scheduler, "cmpl-disagrees", t0 + 100 * MS, vllm_cached=(32, 32))
    request_story(scheduler, "cmpl-fine", t0 + 200 * MS)
    request_story(clean, "cmpl-clean", t0)
    export(backend, scheduler, clean)
    found = accounting(backend, window_s=4 * 3600)
    assert engine_of(found, scheduler.engine_id)["violations"] == 2
    assert engine_of(found, clean.engine_id)["violations"] == 0
    bad = {v["request_id"]: v for v in found["violations"]}
    assert set(bad) == {"cmpl-over", "cmpl-disagrees"}
    assert "exceed the prompt" in bad["cmpl-over"]["violation"]
    assert "vLLM counted 32 local + 32 external" in bad["cmpl-disagrees"]["violation"]
    assert bad["cmpl-disagrees"]["computed_tokens"] == 32  # vLLM's: 96 - 64 cached
    with backend.client() as client:  # the id opens the request's timeline
        timeline = client.get(f"/api/v1/requests/{bad['cmpl-over']['id']}/timeline").json()
    assert timeline["request"]["request_id"] == "cmpl-over"
    metrics = scrape(backend)
    violations = "kvscope_backend_accounting_violations_total"
    assert value(metrics, violations, engine_id=scheduler.engine_id) == 2
    assert value(metrics, violations, engine_id=clean.engine_id) == 0
    hits = "kvscope_backend_hit_tokens_total"
    assert value(metrics, hits, engine_id=clean.engine_id, source="local") == 32
    assert value(metrics, hits, engine_id=clean.engine_id, source="host") == 64
    assert value(metrics, "kvscope_backend_prompt_tokens_total", engine_id=clean.engine_id) == 96
    assert value(metrics, "kvscope_backend_computed_tokens_total", engine_id=clean.engine_id) == 0


def test_the_grafana_dashboard_plots_the_one_hit_rate():
    dashboard = json.loads(GRAFANA.read_text())
    exprs = {p["title"]: [t["expr"] for t in p["targets"]] for p in dashboard["panels"]}
    assert any(PROMQL in found for found in exprs.values())
    for title, found in exprs.items():
        if "hit rate" in title.lower():  # every one over prompt tokens, never a mean of ratios
            assert all("prompt_tokens" in expr for expr in found), title
            assert not any("avg" in expr for expr in found), title
    assert any(
        "kvscope_backend_accounting_violations_total" in e for f in exprs.values() for e in f
    )
