"""The real dashboard in headless Chromium: the overview's token accounting per engine, with the
one hit rate, and each request whose tokens do not add up, linked to its timeline."""

import time

import pytest

from kvscope.dashboard.charts.accounting import headline, violations_table
from tests.backend.queries.test_recomputes import engine_pair, export
from tests.backend.story import MS
from tests.backend.test_accounting import request_story

from .conftest import Dashboard, new_backend, screenshot
from .test_browser import open_page

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def accounting_dashboard(tmp_path_factory):
    with new_backend(tmp_path_factory.mktemp("accounting-db")) as backend:
        scheduler, _ = engine_pair("vllm-decode")
        t0 = time.time_ns() - 120_000 * MS
        request_story(scheduler, "cmpl-fine", t0)  # 32 local + 64 host of 96
        request_story(scheduler, "cmpl-over_1", t0 + 100 * MS, local=64, external=64)
        export(backend, scheduler)
        running = Dashboard(backend.url).wait_ready()
        yield running
        running.stop()


def test_accounting_shows_tokens_by_source_and_links_the_violating_request(
    page, accounting_dashboard
):
    open_page(page, accounting_dashboard, "", "Token accounting")
    page.get_by_text("1 request's tokens do not add up").wait_for()
    engines = page.locator("table").filter(has_text="Prefix cache")
    row = engines.locator("tbody tr").first.inner_text()
    # 32 + 64 local, 64 + 64 host: 224 hit tokens of 192 prompt tokens, over the totals.
    assert "vllm-decode" in row and "host 128" in row and "116.7 %" in row
    violations = page.locator("table").filter(has_text="What does not add up")
    assert "hits exceed the prompt: 128 > 96 tokens" in violations.inner_text()
    link = violations.get_by_role("link", name="cmpl-over_1")  # '_' not read as Markdown
    assert link.get_attribute("href").startswith("requests?request=")
    screenshot(page, "overview_token_accounting")
    page.goto(f"{accounting_dashboard.url}/{link.get_attribute('href')}")
    page.get_by_text("Request cmpl-over_1").wait_for()  # its timeline opened
    assert page.locator("[data-testid=stException]").count() == 0


def test_many_violations_list_the_newest_and_count_the_rest():
    items = [
        {
            "id": n,
            "request_id": f"cmpl-{n}",
            "engine_id": "e",
            "prompt_tokens": 96,
            "violation": "x",
        }
        for n in range(50)
    ]
    found = {"violations": items, "violations_total": 70}
    table = violations_table(found, {"e": "vllm-prefill"})
    assert table.count("](requests?request=") == 10
    assert table.splitlines()[-1].startswith("| and 60 more")
    assert headline({"violations_total": 0}) is None
    assert headline(found).startswith("70 requests' tokens do not add up")
