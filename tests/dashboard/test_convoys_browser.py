"""The real dashboard in headless Chromium: a request of a real engine's burst that waited for
another request's load of the same host blocks says so on its timeline, queued or served."""

import time

import httpx
import pytest
from opentelemetry.sdk.trace.export import SpanExportResult

from kvscope.traces import names
from tests.backend.test_convoys import burst, convoy_spans

from .conftest import Dashboard, new_backend, screenshot
from .test_browser import open_page

pytestmark = [pytest.mark.engine, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def convoy_dashboard(tmp_path_factory, tiny_model, span_exporter):
    """A backend fed both bursts' spans (a load each, then one shared load), and its dashboard."""
    from kvscope.traces.sdk.configure import flush

    exported = []  # every span, the warm-ups' too: a gap in a process's spans is reported

    def spans():
        flush()
        finished = list(span_exporter.get_finished_spans())
        span_exporter.clear()
        exported.extend(finished)
        return finished

    with new_backend(tmp_path_factory.mktemp("convoy-db")) as backend:
        span_exporter.clear()
        waits = {}
        for share_loads in (False, True):
            _, finished, _ = burst(tiny_model, spans, share_loads=share_loads)
            [waited, *_] = convoy_spans(finished)
            waits[share_loads] = waited.attributes[names.REQUEST_ID]
        assert backend.export(exported) == SpanExportResult.SUCCESS
        running = Dashboard(backend.url).wait_ready()
        yield running, {share: _row_id(backend, req_id) for share, req_id in waits.items()}
        running.stop()


def _row_id(backend, req_id: str, timeout_s: float = 20.0) -> int:
    deadline = time.monotonic() + timeout_s
    with httpx.Client(base_url=backend.url, timeout=10) as client:
        while time.monotonic() < deadline:
            found = client.get("/api/v1/requests", params={"request_id": req_id}).json()
            if found["items"]:
                return found["items"][0]["id"]
            time.sleep(0.1)
    raise AssertionError(f"request {req_id} not stored within {timeout_s} s")


def test_a_queued_load_and_a_shared_one_are_told_on_the_timeline(page, convoy_dashboard):
    dashboard, rows = convoy_dashboard
    open_page(page, dashboard, f"requests?request={rows[False]}", "Spans and KV timeline points")
    page.get_by_text("on the copy thread behind request", exact=False).wait_for()
    assert page.get_by_text("a load convoy", exact=False).count() == 1
    page.locator("[data-testid=stVegaLiteChart]").nth(1).wait_for()  # TTFT and Gantt
    screenshot(page, "requests_load_convoy")
    open_page(page, dashboard, f"requests?request={rows[True]}", "Spans and KV timeline points")
    page.get_by_text("one load served both", exact=False).wait_for()
    page.locator("[data-testid=stVegaLiteChart]").nth(1).wait_for()
    screenshot(page, "requests_shared_load")
