"""The Sizing page in headless Chromium: an engine's replayed hit rate and time saved against
host pool size, per policy, from its recorded lookups and stores."""

import time

import pytest
from opentelemetry.sdk.trace.export import SpanExportResult

from kvscope.dashboard.charts.sizing import sizing_frame
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


def _store(scheduler: Process, req_id: str, at_ns: int, keys: list[str]) -> None:
    stored = {names.REQUEST_ID: req_id, names.BLOCK_HASHES: keys, names.BLOCK_TIER: "host"}
    scheduler.hook(
        "update_connector_output",
        None,
        at_ns,
        at_ns + MS,
        events=[(names.EVENT_BLOCK_STORED, at_ns, stored)],
    )


@pytest.fixture(scope="module")
def sizing_dashboard(tmp_path_factory):
    """One engine: r1 stores two blocks, r2 finds them and stores a third; a pool of 4."""
    scheduler = Process("vllm-offload", "engine-sizing", "scheduler")
    t0 = time.time_ns() - 60_000 * MS
    _lookup(scheduler, "cmpl-1", t0, ["k1", "k2"], 0)
    _store(scheduler, "cmpl-1", t0 + 10 * MS, ["k1", "k2"])
    _lookup(scheduler, "cmpl-2", t0 + 20 * MS, ["k1", "k2", "k3"], 64)
    _store(scheduler, "cmpl-2", t0 + 30 * MS, ["k3"])
    with new_backend(tmp_path_factory.mktemp("sizing-db")) as backend:
        assert backend.export(scheduler.spans()) == SpanExportResult.SUCCESS
        running = Dashboard(backend.url).wait_ready()
        yield running
        running.stop()


def test_sizing_plots_hit_rate_and_says_what_today_hits(page, sizing_dashboard):
    open_page(page, sizing_dashboard, "sizing", "Hit rate against pool size")
    page.get_by_text(
        "Today: 4 blocks of 32 tokens; 2 lookups asked 160 tokens and 64 were hit. "
        "The replay of today's pool hits 64."
    ).wait_for()
    drawn = page.locator("[data-testid=stVegaLiteChart] canvas, [data-testid=stVegaLiteChart] svg")
    drawn.first.wait_for()
    # No load or step spans in this story: time saved is not guessed.
    page.get_by_text("No load or prefill timing in this window").wait_for()
    screenshot(page, "sizing")


def test_the_frame_has_a_row_per_policy_and_size():
    engine = {
        "rows": [
            {
                "policy": policy,
                "factor": factor,
                "pool_blocks": int(4 * factor),
                "hit_tokens": 64,
                "pool_hit_rate": 0.4,
                "prefill_tokens_saved": 64,
                "seconds_saved": None,
                "evicted_blocks": 0,
            }
            for policy in ("lru", "2q")
            for factor in (0.5, 1.0, 2.0)
        ]
    }
    frame = sizing_frame(engine)
    assert len(frame) == 6 and set(frame["size"]) == {"0.5x", "1x", "2x"}
    assert frame["pool hit rate %"].tolist() == [40.0] * 6
