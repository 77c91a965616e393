"""The real dashboard in headless Chromium: the overview's silent recomputes, per engine and
cause, each request a link that opens its timeline; a calm line when there are none."""

import time

import pytest

from kvscope.dashboard.charts.recomputes import LINKS_SHOWN, headline, recomputes_table
from tests.backend.queries.test_recomputes import export, recompute_story
from tests.backend.story import MS, Process, load_story

from .conftest import Dashboard, new_backend, screenshot
from .test_browser import open_page

pytestmark = pytest.mark.timeout(180)


def _recomputing_engine(backend) -> None:
    """A decode engine: two requests answered after a failed load (one a timeout), one clean."""
    scheduler = Process("vllm-decode", "engine-decode-1", "scheduler")
    worker = Process("vllm-decode", "engine-decode-1", "worker")
    t0 = time.time_ns() - 120_000 * MS
    recompute_story(scheduler, worker, "cmpl-silent_1", t0)
    recompute_story(scheduler, worker, "cmpl-silent-2", t0 + 100 * MS, cause="timeout", to_load=96)
    load_story(scheduler, worker, None, "cmpl-clean-1", t0 + 200 * MS)
    export(backend, scheduler, worker)


@pytest.fixture(scope="module")
def recompute_dashboard(tmp_path_factory):
    with new_backend(tmp_path_factory.mktemp("recompute-db")) as backend:
        _recomputing_engine(backend)
        running = Dashboard(backend.url).wait_ready()
        yield running
        running.stop()


@pytest.fixture(scope="module")
def clean_dashboard(tmp_path_factory):
    with new_backend(tmp_path_factory.mktemp("clean-db")) as backend:
        scheduler = Process("vllm-decode", "engine-clean", "scheduler")
        worker = Process("vllm-decode", "engine-clean", "worker")
        load_story(scheduler, worker, None, "cmpl-clean-1", time.time_ns() - 60_000 * MS)
        export(backend, scheduler, worker)
        running = Dashboard(backend.url).wait_ready()
        yield running
        running.stop()


def test_silent_recomputes_show_per_engine_and_cause_with_links(page, recompute_dashboard):
    open_page(page, recompute_dashboard, "", "Silent recomputes")
    page.get_by_text(
        "2 requests were answered normally although a KV load failed and vLLM recomputed it: "
        "160 prefill tokens computed again."
    ).wait_for()
    table = page.locator("table").filter(has_text="Tokens recomputed")
    rows = {
        row.locator("td").nth(1).inner_text(): row.inner_text()
        for row in table.locator("tbody tr").all()
    }
    assert set(rows) == {"InjectedFault", "timeout"}
    assert "vllm-decode (kv_both)" in rows["timeout"] and "96" in rows["timeout"]
    assert "cmpl-silent_1" in rows["InjectedFault"]  # an id's '_' is not read as Markdown
    link = table.get_by_role("link", name="cmpl-silent-2")
    assert link.get_attribute("href").startswith("requests?request=")
    screenshot(page, "overview_silent_recomputes")
    page.goto(f"{recompute_dashboard.url}/{link.get_attribute('href')}")
    page.get_by_text("Request cmpl-silent-2").wait_for()  # its timeline opened
    assert page.locator("[data-testid=stException]").count() == 0


def test_no_silent_recomputes_is_a_calm_line(page, clean_dashboard):
    open_page(page, clean_dashboard, "", "Silent recomputes")
    page.get_by_text("No request needed a failed KV load recomputed in this window.").wait_for()
    assert page.get_by_text("answered normally although a KV load failed").count() == 0
    assert page.locator("table").filter(has_text="Tokens recomputed").count() == 0


def test_a_row_with_many_requests_links_the_newest_and_counts_the_rest():
    items = [{"id": n, "request_id": f"cmpl-{n}"} for n in range(50)]
    row = {
        "engine_id": "engine-a",
        "cause": "timeout",
        "requests": 120,
        "load_failures": 130,
        "recomputed_tokens": 7680,
        "tokens_unknown": 2,
        "items": items,
    }
    table = recomputes_table({"requests": 120, "rows": [row]}, {"engine-a": "vllm-decode"})
    line = table.splitlines()[-1]
    assert line.count("](requests?request=") == LINKS_SHOWN
    assert line.endswith(" and 110 more |")
    assert "7,680 (+2 unknown)" in line and "vllm\\-decode" in line
    assert headline({"requests": 0, "recomputed_tokens": 0, "rows": []}) is None
    assert headline({"requests": 120, "recomputed_tokens": 7680, "rows": [row]}).endswith(
        "at least 7,680 prefill tokens computed again."
    )
    unknown = {**row, "recomputed_tokens": 0, "tokens_unknown": 120}
    assert "| 130 | unknown |" in recomputes_table({"rows": [unknown]}, {})
