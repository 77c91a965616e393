"""The real dashboard in headless Chromium against a backend fed with real spans."""

import json
import time
import uuid

import httpx
import pytest

from tests.backend.story import MS, Process, failure_story

from .conftest import SCREENSHOTS, Dashboard, new_backend, screenshot

pytestmark = pytest.mark.timeout(120)


def open_page(page, dashboard, path: str, ready_text: str):
    page.goto(f"{dashboard.url}/{path}")
    page.get_by_text(ready_text, exact=False).first.wait_for()
    assert page.locator("[data-testid=stException]").count() == 0
    return page


def test_overview_shows_window_figures(page, dashboard):
    open_page(page, dashboard, "", "External hit rate by connector")
    figures = dict(_metrics(page))
    assert int(figures["Requests"]) >= 6  # the six recorded requests and the stories
    assert figures["Active leases"] == "2"
    assert int(figures["Failure incidents"]) >= 1
    screenshot(page, "overview")


SERIES = [
    "External hit rate",
    "Bytes/s per path",
    "Leases held",
    "TTFT and its KV wait",
    "Failure incidents per cause",
]


def test_overview_series_render_with_data(page, dashboard):
    open_page(page, dashboard, "", "Over time")
    for title in SERIES:
        page.locator("strong").get_by_text(title, exact=True).wait_for()
    charts = page.locator("[data-testid=stVegaLiteChart]")
    charts.nth(len(SERIES) - 1).wait_for()  # every series drew a chart...
    assert page.get_by_text("Nothing in this window.").count() == 0  # ...none was empty
    # Vega draws marks into each chart's canvas or SVG once it has data to draw.
    drawn = page.locator("[data-testid=stVegaLiteChart] canvas, [data-testid=stVegaLiteChart] svg")
    drawn.nth(len(SERIES) - 1).wait_for()
    page.get_by_text("Engines", exact=True).wait_for()
    # The engines table (a canvas grid: its cells are in the page, not visible) by service.
    page.get_by_text("kvscope-scheduler (kv_both)").first.wait_for(state="attached")
    screenshot(page, "overview_series")


def test_blocks_map_and_block_history(page, dashboard):
    open_page(page, dashboard, "blocks", "3000 blocks")
    # First panel: the recorded engine's device blocks whose injected load failed.
    page.get_by_text("Load failures that named this block").wait_for()
    page.get_by_label("Engine · tier").click()
    page.get_by_role("option", name="kvscope-scheduler (kv_both) · engine-p · host").click()
    page.get_by_text("Holders: leases that pinned this host block").wait_for()
    maps = page.locator("[data-testid=stVegaLiteChart]")
    maps.nth(1).wait_for()  # the pool's host tier and the story engine's tiers
    assert maps.count() >= 3
    screenshot(page, "blocks")


def test_leases_held_and_overdue(page, dashboard):
    open_page(page, dashboard, "leases", "Held now")
    figures = dict(_metrics(page))
    assert figures["Held"] == "2"  # held-1 for an hour, late-1 past its expiry
    assert figures["Overdue"] == "1"
    assert int(figures["Expired (recent)"]) >= 1  # the failure story's lease
    page.get_by_text("Age of held leases against their timeout").wait_for()
    page.locator("[data-testid=stVegaLiteChart]").first.wait_for()
    page.get_by_text("Held now, oldest first").wait_for()
    screenshot(page, "leases")


def test_request_timeline_opens(page, dashboard, fed_backend):
    found = httpx.get(f"{fed_backend.url}/api/v1/requests", params={"request_id": "4-872dedf9"})
    key = found.json()["items"][0]["id"]
    open_page(page, dashboard, f"requests?request={key}", "Request 4-872dedf9")
    page.get_by_text("Spans and KV timeline points").wait_for()
    page.get_by_text("Time to first token").wait_for()
    page.locator("[data-testid=stVegaLiteChart]").nth(1).wait_for()  # TTFT and Gantt
    screenshot(page, "request_timeline")


def test_new_failure_appears_without_reload(page, dashboard, fed_backend):
    open_page(page, dashboard, "failures", "Failures")
    page.get_by_text("story-fail-1").first.wait_for()
    page.evaluate("window.__kvscopeSameDocument = true")
    req_id = f"live-fail-{uuid.uuid4().hex[:6]}"
    scheduler = Process("kvscope-scheduler", "engine-live", "scheduler")
    worker = Process("kvscope-worker", "engine-live", "worker")
    failure_story(scheduler, worker, req_id, time.time_ns() - 10 * MS)
    sent = time.monotonic()
    fed_backend.export(scheduler.spans() + worker.spans())
    page.get_by_text(req_id).first.wait_for(timeout=10_000)
    latency_s = time.monotonic() - sent
    assert page.evaluate("window.__kvscopeSameDocument === true"), "the page was reloaded"
    _record("failure_on_page_s", latency_s)
    assert latency_s < 5.0, f"new failure took {latency_s:.1f} s to show"
    screenshot(page, "failures")


def test_no_data_then_backend_unreachable(page, tmp_path):
    backend = new_backend(tmp_path).__enter__()
    dashboard = Dashboard(backend.url).wait_ready()
    try:
        open_page(page, dashboard, "failures", "No data yet")
        screenshot(page, "no_data")
        backend.__exit__(None, None, None)
        page.get_by_text("Backend unreachable").wait_for()  # same page, next refresh
        screenshot(page, "backend_unreachable")
    finally:
        dashboard.stop()
        backend.__exit__(None, None, None)


def _metrics(page):
    page.locator("[data-testid=stMetric]").first.wait_for()
    for text in page.locator("[data-testid=stMetric]").all_inner_texts():
        label, _, value = text.strip().rpartition("\n")
        yield label.strip(), value.strip()


def _record(name: str, value: float) -> None:
    """Measured live-update latencies, kept next to the screenshots."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / "live_latency.json"
    found = json.loads(path.read_text()) if path.exists() else {}
    found[name] = round(value, 3)
    path.write_text(json.dumps(found, indent=1))
