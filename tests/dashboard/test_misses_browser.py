"""The real dashboard in headless Chromium over the demo's recorded spans (real engines): the
overview's miss reasons per engine, one request's reasons on the Requests page, and a host
tier written and never read said in words (the recording with its lookups' events dropped)."""

import gzip
import json

import pytest

from kvscope.demo.replay import RECORDINGS, recorded_lines, replay
from kvscope.traces import names

from .conftest import Dashboard, new_backend, screenshot
from .test_browser import open_page

pytestmark = pytest.mark.timeout(240)


def _dashboard_over(path, tmp_path_factory, name):
    backend = new_backend(tmp_path_factory.mktemp(name)).__enter__()
    replay(path, backend.url, None, 0, now=True)
    return backend, Dashboard(backend.url).wait_ready()


@pytest.fixture(scope="module")
def demo_dashboard(tmp_path_factory):
    backend, running = _dashboard_over(RECORDINGS / "demo.jsonl.gz", tmp_path_factory, "miss")
    yield backend, running
    running.stop()
    backend.__exit__(None, None, None)


@pytest.fixture(scope="module")
def unread_dashboard(tmp_path_factory):
    """The pools stored what they stored, and no lookup is recorded: none was read."""
    path = tmp_path_factory.mktemp("unread") / "demo.jsonl.gz"
    with gzip.open(path, "wb") as out:
        for line in recorded_lines(RECORDINGS / "demo.jsonl.gz"):
            batch = json.loads(line)
            for spans in batch["resourceSpans"]:
                for scope in spans.get("scopeSpans", ()):
                    for span in scope.get("spans", ()):
                        span["events"] = [
                            e
                            for e in span.get("events", ())
                            if e["name"] != names.EVENT_BLOCK_LOOKED_UP
                        ]
            out.write(json.dumps(batch).encode() + b"\n")
    backend, running = _dashboard_over(path, tmp_path_factory, "unread-db")
    yield running
    running.stop()
    backend.__exit__(None, None, None)


def test_overview_says_why_tokens_missed_per_engine(page, demo_dashboard):
    _, running = demo_dashboard
    open_page(page, running, "", "Why tokens missed")
    table = page.locator("table").filter(has_text="By reason (share of missed)")
    rows = table.locator("tbody tr")
    assert rows.count() == 2  # the demo's prefill and decode engines
    text = table.inner_text()
    assert "prefix diverged" in text and "vLLM's prefix cache" in text
    assert page.get_by_text("of missed tokens").count() >= 1  # the headline
    assert page.get_by_text("written, never read").count() == 0  # a healthy pool
    screenshot(page, "overview_miss_reasons")


def test_a_requests_page_lists_its_missed_tokens_by_reason(page, demo_dashboard):
    backend, running = demo_dashboard
    with backend.client() as client:
        found = client.get("/api/v1/stats/misses", params={"window_s": 10**6}).json()
    request = next(r for r in found["requests"] if any(x["first_block"] for x in r["reasons"]))
    open_page(page, running, f"requests?request={request['id']}", "Why tokens missed:")
    page.get_by_text(f"{request['missed_tokens']:,} of {request['prompt_tokens']:,}").wait_for()
    first = next(x for x in request["reasons"] if x["first_block"] is not None)
    assert page.get_by_text(f"blocks {first['first_block']}-").count() >= 1
    screenshot(page, "request_miss_reasons")


def test_a_pool_written_and_never_read_raises_its_alarm(page, unread_dashboard):
    open_page(page, unread_dashboard, "", "Overview")
    page.get_by_text("written, never read").first.wait_for()
    assert page.get_by_text("blocks (").count() >= 1  # the bytes stored are named
    screenshot(page, "overview_tier_alarm")
