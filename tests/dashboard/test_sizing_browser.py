"""The Sizing page in headless Chromium: an engine's replayed hit rate and predicted TTFT against
host pool size, per policy, with its ceiling and knees, from its recorded lookups and stores,
its load and step timings and vLLM's llm_request spans."""

import time

import pytest
from opentelemetry.sdk.trace.export import SpanExportResult

from kvscope.dashboard.charts.sizing import curve_frame, sizing_frame
from kvscope.dashboard.charts.sizing_curves import hit_rate_chart, ttft_chart
from kvscope.traces import names
from tests.backend.story import MS, Process

from .conftest import Dashboard, new_backend, screenshot
from .test_browser import open_page

pytestmark = pytest.mark.timeout(180)


def _lookup(scheduler: Process, req_id: str, at_ns: int, keys: list[str], hit: int) -> None:
    asked = {
        names.BLOCK_HASHES: keys,
        names.BLOCK_COUNT: len(keys),
        names.BLOCK_SIZE: 32,
        names.HOST_POOL_BLOCKS: 4,
    }
    scheduler.hook(
        "get_num_new_matched_tokens",
        None,
        at_ns,
        at_ns + MS,
        events=[(names.EVENT_BLOCK_LOOKED_UP, at_ns, asked)],
        **{names.REQUEST_ID: req_id, names.TOKENS_EXTERNAL_HIT: hit},
    )


def _step(scheduler: Process, worker: Process, req_id: str, at_ns: int, step: int) -> None:
    """A step that computes 96 tokens of the request in 10 ms: a prefill rate of 9,600/s."""
    scheduler.hook(
        "build_connector_meta",
        None,
        at_ns,
        at_ns + MS // 10,
        **{names.STEP: step, names.TOKENS_SCHEDULED: 96, names.REQUEST_IDS: [req_id]},
    )
    worker.start(names.SPAN_STEP, at_ns, **{names.STEP: step}).end(end_time=at_ns + 10 * MS)


def _store(scheduler: Process, req_id: str, at_ns: int, keys: list[str]) -> None:
    stored = {names.REQUEST_ID: req_id, names.BLOCK_HASHES: keys, names.BLOCK_TIER: "host"}
    scheduler.hook(
        "update_connector_output",
        None,
        at_ns,
        at_ns + MS,
        events=[(names.EVENT_BLOCK_STORED, at_ns, stored)],
    )


def _load(worker: Process, req_id: str, at_ns: int) -> None:
    """Two blocks (64 tokens) loaded in 1 ms: a load rate of 64,000 tokens/s."""
    attributes = {
        names.REQUEST_ID: req_id,
        names.TRANSFER_DIRECTION: "load",
        names.BLOCK_COUNT: 2,
        names.TRANSFER_DURATION_MS: 1.0,
    }
    worker.start(names.SPAN_TRANSFER, at_ns, **attributes).end(end_time=at_ns + MS)


def _ttft(api: Process, req_id: str, at_ns: int, ttft_s: float) -> None:
    attributes = {names.REQUEST_ID: req_id, "gen_ai.latency.time_to_first_token": ttft_s}
    api.start("llm_request", at_ns, **attributes).end(end_time=at_ns + 60 * MS)


@pytest.fixture(scope="module")
def sizing_dashboard(tmp_path_factory):
    """One engine with a pool of 4: cmpl-1 stores two blocks (TTFT 50 ms), cmpl-2 finds them,
    loads them and stores a third (TTFT 20 ms). The ceiling is 3 blocks; 2 reach it."""
    scheduler = Process("vllm-offload", "engine-sizing", "scheduler")
    worker = Process("vllm-offload", "engine-sizing", "worker")
    api = Process("vllm-api", "engine-sizing", "api")
    t0 = time.time_ns() - 60_000 * MS
    _ttft(api, "cmpl-1", t0 - MS, 0.050)
    _lookup(scheduler, "cmpl-1", t0, ["k1", "k2"], 0)
    _step(scheduler, worker, "cmpl-1", t0 + 2 * MS, 1)
    _store(scheduler, "cmpl-1", t0 + 13 * MS, ["k1", "k2"])
    _ttft(api, "cmpl-2", t0 + 19 * MS, 0.020)
    _lookup(scheduler, "cmpl-2", t0 + 20 * MS, ["k1", "k2", "k3"], 64)
    _load(worker, "cmpl-2", t0 + 21 * MS)
    _step(scheduler, worker, "cmpl-2", t0 + 23 * MS, 2)
    _store(scheduler, "cmpl-2", t0 + 34 * MS, ["k3"])
    with new_backend(tmp_path_factory.mktemp("sizing-db")) as backend:
        spans = scheduler.spans() + worker.spans() + api.spans()
        assert backend.export(spans) == SpanExportResult.SUCCESS
        running = Dashboard(backend.url).wait_ready()
        yield running
        running.stop()


def test_sizing_names_the_ceiling_and_the_knee_and_plots_hit_rate_and_ttft(page, sizing_dashboard):
    open_page(page, sizing_dashboard, "sizing", "Hit rate against pool size")
    page.get_by_text(
        "Today: 4 blocks of 32 tokens; 2 lookups asked 160 tokens and 64 were hit. "
        "The replay of today's pool hits 64. Measured TTFT p50 35.0 ms, p95 48.5 ms over 2 "
        "requests."
    ).wait_for()
    page.get_by_text(
        "Ceiling (a pool that never evicts): 3 blocks hit 64 tokens (40.0% of those asked). "
        "0 lookups found a block still being stored and missed it there too (0 tokens); "
        "today's pool recorded 0."
    ).wait_for()
    page.get_by_text(
        "Knee (the smallest pool within 1% of the ceiling, to a size step of 1 block): "
        "LRU (the pool's own) at 2 blocks (0.5x today's)",
        exact=False,
    ).wait_for()
    page.get_by_text("Predicted TTFT against pool size").wait_for()
    charts = page.locator("[data-testid=stVegaLiteChart]")
    charts.nth(1).locator("canvas, svg").first.wait_for()  # both charts drawn
    assert charts.count() == 2
    assert page.get_by_text("No measured TTFT").count() == 0
    screenshot(page, "sizing")


def _engine() -> dict:
    served = {"predicted_ttft_ms_p50": 30.0, "predicted_ttft_ms_p95": 45.0}
    rows = [
        {
            "policy": policy,
            "factor": factor,
            "pool_blocks": int(4 * factor),
            "hit_tokens": 64,
            "pool_hit_rate": 0.4,
            "prefill_tokens_saved": 64,
            "seconds_saved": None,
            "evicted_blocks": 0,
            "in_flight_lookups": 0,
            "in_flight_tokens": 0,
            **served,
        }
        for policy in ("lru", "2q")
        for factor in (0.5, 1.0, 2.0)
    ]
    knees = [
        {"policy": p, "pool_blocks": 3, "factor": 0.75, "hit_tokens": 64, "pool_hit_rate": 0.4}
        | served
        for p in ("lru", "2q")
    ]
    ceiling = {"pool_blocks": 3, "pool_hit_rate": 0.4}
    return {"rows": rows, "knees": knees, "ceiling": ceiling, "measured_ttft_ms_p50": 35.0}


def test_the_frame_has_a_row_per_policy_and_size():
    frame = sizing_frame(_engine())
    assert len(frame) == 6 and set(frame["size"]) == {"0.5x", "1x", "2x"}
    assert frame["pool hit rate %"].tolist() == [40.0] * 6


def test_the_curves_mark_each_knee_and_the_ceiling():
    engine = _engine()
    curve = curve_frame(engine)
    assert curve[curve["point"] == "knee"]["pool blocks"].tolist() == [3, 3]
    assert len(curve) == 8  # three sizes and a knee, a policy
    hit_rate = hit_rate_chart(curve, engine["ceiling"]).to_dict()
    marks = [layer["mark"]["type"] for layer in hit_rate["layer"]]
    assert marks == ["line", "point", "rule", "rule", "text"]  # curves, knees, the ceiling
    ttft = ttft_chart(curve, engine["measured_ttft_ms_p50"]).to_dict()
    assert [layer["mark"]["type"] for layer in ttft["layer"]] == ["line", "point", "rule"]
