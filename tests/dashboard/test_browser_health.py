"""The real dashboard in headless Chromium: tier health, clock offsets and KV cache groups."""

import time

import pytest

from kvscope.backend.queries.clocks import MIN_SAMPLES
from kvscope.traces import names
from tests.backend.story import MS, Process

from .conftest import Dashboard, new_backend, screenshot
from .test_browser import open_page

pytestmark = pytest.mark.timeout(120)


def _tier_span(process: Process, at_ns: int, state: str, reason: str) -> None:
    attributes = {
        names.TIER: "cpu_offload",
        names.TIER_STATE: state,
        names.TIER_REASON: reason,
        names.TIER_FAILURES: 3,
        names.TIER_BYPASS_S: 30.0,
    }
    process.tracer.start_span(names.SPAN_TIER_HEALTH, start_time=at_ns, attributes=attributes).end(
        end_time=at_ns
    )


def _feed(backend) -> None:
    """A decode engine 2 s ahead whose offload tier is bypassed; a prefill engine whose blocks
    come in two KV cache groups."""
    decode = Process("vllm-decode", "engine-d", "scheduler")
    prefill = Process("vllm-prefill", "engine-p", "worker")
    for _ in range(MIN_SAMPLES):
        now = time.time_ns()
        decode.hook("get_num_new_matched_tokens", None, now + 2000 * MS - MS, now + 2000 * MS)
        prefill.hook("get_num_new_matched_tokens", None, now - MS, now)
    _tier_span(decode, time.time_ns() + 2000 * MS, "bypassed", "timeout: load took 1.5 s")
    loaded = {
        names.BLOCK_TIER: "device",
        names.BLOCK_IDS: [1, 2, 1],
        names.KV_CACHE_GROUP_IDS: [0, 0, 1],
        names.REQUEST_ID: "req-g",
    }
    now = time.time_ns()
    prefill.hook("start_load_kv", None, now, now + MS, [(names.EVENT_BLOCK_LOADED, now, loaded)])
    backend.export(decode.spans())
    backend.export(prefill.spans())


@pytest.fixture(scope="module")
def health_dashboard(tmp_path_factory):
    with new_backend(tmp_path_factory.mktemp("health-db")) as backend:
        _feed(backend)
        running = Dashboard(backend.url).wait_ready()
        yield running
        running.stop()


def test_a_bypassed_tier_and_mixed_clocks_show_on_the_overview(page, health_dashboard):
    open_page(page, health_dashboard, "", "Tiers")
    page.get_by_text("Bypassed (lookups answer 0, loads recompute): cpu_offload on").wait_for()
    page.get_by_text("vllm-decode", exact=False).first.wait_for(state="attached")
    page.get_by_text("Reporting processes' clocks differ by about", exact=False).wait_for()
    page.get_by_text("Clocks: offset of each process against the backend").click()
    page.get_by_text("never less than shown", exact=False).wait_for()
    screenshot(page, "overview_tiers_clocks")


def test_blocks_of_two_groups_have_their_own_maps_and_a_group_filter(page, health_dashboard):
    open_page(page, health_dashboard, "blocks", "KV cache groups")
    page.get_by_text("· device · group 1", exact=False).first.wait_for()
    maps = page.locator("[data-testid=stVegaLiteChart]")
    maps.nth(1).wait_for()  # one map per group
    assert maps.count() == 2
    page.get_by_text("KV cache group 0 · hash", exact=False).wait_for()
    screenshot(page, "blocks_groups")
