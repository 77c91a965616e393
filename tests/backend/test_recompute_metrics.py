"""GET /metrics counts silent recomputes per engine and cause, read with prometheus_client's
parser: no window, the same figures as the REST answer, nothing for a clean load."""

import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from .queries.test_recomputes import engine_pair, export, recompute_story, recomputes, rows_of
from .story import MS
from .test_metrics import scrape, value

pytestmark = pytest.mark.timeout(120)

REQUESTS = "kvscope_backend_silent_recomputes_total"
TOKENS = "kvscope_backend_silent_recompute_tokens_total"


def test_silent_recomputes_and_their_tokens_are_counters_per_engine_and_cause(make_backend):
    backend = make_backend()
    scheduler, worker = engine_pair()
    other, other_worker = engine_pair("vllm-other")
    # Three hours ago: a scrape has no window, so old requests still count.
    t0 = time.time_ns() - 3 * 3600 * 1000 * MS
    recompute_story(scheduler, worker, "cmpl-a", t0)
    recompute_story(scheduler, worker, "cmpl-b", t0 + 100 * MS, to_load=96, block_ids=[1, 2, 3])
    recompute_story(scheduler, worker, "cmpl-c", t0 + 200 * MS, cause="timeout")
    recompute_story(scheduler, worker, "cmpl-aborted", t0 + 300 * MS, status="FINISHED_ABORTED")
    recompute_story(other, other_worker, "cmpl-clean", t0, fails=False)
    export(backend, scheduler, worker, other, other_worker)
    found = scrape(backend)
    engine = scheduler.engine_id
    assert value(found, REQUESTS, engine_id=engine, cause="InjectedFault") == 2
    assert value(found, TOKENS, engine_id=engine, cause="InjectedFault") == 64 + 96
    assert value(found, REQUESTS, engine_id=engine, cause="timeout") == 1
    assert value(found, TOKENS, engine_id=engine, cause="timeout") == 64
    assert [labels for labels, _ in found.get(REQUESTS, [])] == [
        {"engine_id": engine, "cause": "InjectedFault"},
        {"engine_id": engine, "cause": "timeout"},
    ]  # the aborted request and the clean engine add nothing
    # The REST answer over a window that holds them says the same.
    rows = {r["cause"]: r for r in rows_of(recomputes(backend, 4 * 3600), engine)}
    assert {cause: r["requests"] for cause, r in rows.items()} == {"InjectedFault": 2, "timeout": 1}
    assert rows["InjectedFault"]["recomputed_tokens"] == 160


def test_a_backend_without_recomputes_exposes_the_counters_empty(make_backend):
    backend = make_backend()
    with backend.client(token="") as client:
        families = list(text_string_to_metric_families(client.get("/metrics").text))
    empty = {f.name: (f.type, f.samples) for f in families if "silent_recompute" in f.name}
    assert empty == {
        REQUESTS.removesuffix("_total"): ("counter", []),
        TOKENS.removesuffix("_total"): ("counter", []),
    }
