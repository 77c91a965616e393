"""Load convoys on a real engine: requests sharing a prefix in the host pool wait for one load of
it (or, with share_loads off, each load it, queued behind the first); each wait is on its
request's timeline and counted per engine by the API."""

import time

import pytest
from opentelemetry.sdk.trace.export import SpanExportResult

from kvscope.harness.configs import offload_config
from kvscope.harness.engine import in_process_llm
from kvscope.harness.engine_state import scheduler_connector
from kvscope.harness.oracle import greedy_tokens, token_mismatches
from kvscope.harness.prompts import long_prompt
from kvscope.traces import names
from tests.oracle_cache import prompt_set
from tests.stepping import step_until, step_until_prefix_cache_reset

pytestmark = [pytest.mark.engine, pytest.mark.timeout(300)]
SHARED = [long_prompt(0, 8) + f" Then question {i} asks something else." for i in range(5)]
BASELINE = prompt_set(SHARED)
LOAD_DELAY_MS = 30
"""Every load's copy lasts at least this: the loads queued behind the first wait for it."""


def convoy_spans(spans) -> list:
    return [
        s
        for s in spans
        if s.name == names.SPAN_REQUEST_EVENT
        and s.attributes.get(names.TIMELINE_POINT) == names.LOAD_CONVOY_POINT
    ]


def burst(tiny_model, spans, engine=None, **extra) -> tuple[list[list[int]], list, int]:
    """SHARED together after the first stored their prefix: tokens, spans, blocks loaded.
    engine: vllm.LLM arguments; extra: the connector's."""
    config = offload_config(faults={"load_delay_ms": LOAD_DELAY_MS}, **extra)
    with in_process_llm(tiny_model, config, **(engine or {})) as llm:
        greedy_tokens(llm, SHARED[:1])
        offload = scheduler_connector(llm).scheduler
        step_until(llm, lambda: not offload.stores.in_flight)
        step_until_prefix_cache_reset(llm)
        spans()  # only the burst's spans from here
        together = greedy_tokens(llm, SHARED)
        step_until(llm, lambda: not offload.requests)
        return together, spans(), offload.stats.loaded_blocks


def test_one_load_of_a_shared_prefix_serves_every_request_that_waited_for_it(
    tiny_model, oracle, spans
):
    expected = oracle.tokens(BASELINE)
    together, finished, loaded = burst(tiny_model, spans)
    assert token_mismatches(expected, together) == []
    convoys = convoy_spans(finished)
    assert len(convoys) == len(SHARED) - 1, [s.attributes for s in convoys]
    assert all(s.attributes[names.CONVOY_SHARED_LOAD] for s in convoys)
    [leader] = {s.attributes[names.CONVOY_LEADER] for s in convoys}
    [shared_blocks] = {s.attributes[names.CONVOY_SHARED_BLOCKS] for s in convoys}
    assert loaded == shared_blocks > 0  # the leader's load alone: the others hit vLLM's cache
    loads = [
        s
        for s in finished
        if s.name == names.SPAN_TRANSFER and s.attributes[names.TRANSFER_DIRECTION] == "load"
    ]
    assert [s.attributes[names.REQUEST_ID] for s in loads] == [leader]
    # Each waited for the leader's copy, which its injected delay kept busy.
    assert min(s.end_time - s.start_time for s in convoys) >= LOAD_DELAY_MS * 0.9e6


def test_without_vllms_prefix_cache_every_request_loads_its_own(tiny_model, oracle, spans):
    """The waiting requests would find nothing there: none is held back."""
    expected = oracle.tokens(BASELINE)
    engine = {"enable_prefix_caching": False}
    together, finished, loaded = burst(tiny_model, spans, engine)
    assert token_mismatches(expected, together) == []
    convoys = convoy_spans(finished)
    assert len(convoys) == len(SHARED) - 1  # queued behind the first, not served by it
    assert not any(s.attributes[names.CONVOY_SHARED_LOAD] for s in convoys)
    assert loaded == len(SHARED) * convoys[0].attributes[names.CONVOY_SHARED_BLOCKS]


def test_loads_of_one_prefix_queue_behind_the_first_and_the_api_counts_them(
    tiny_model, oracle, spans, backend
):
    expected = oracle.tokens(BASELINE)
    together, finished, loaded = burst(tiny_model, spans, share_loads=False)
    assert token_mismatches(expected, together) == []
    convoys = convoy_spans(finished)
    # Every request leased and loaded the shared blocks; all but the first queued behind it.
    assert len(convoys) == len(SHARED) - 1, [s.attributes for s in convoys]
    assert not any(s.attributes[names.CONVOY_SHARED_LOAD] for s in convoys)
    waiting = {s.attributes[names.REQUEST_ID] for s in convoys}
    [leader] = {s.attributes[names.CONVOY_LEADER] for s in convoys}
    assert leader not in waiting and len(waiting) == len(SHARED) - 1
    shared_blocks = loaded // len(SHARED)
    assert {s.attributes[names.CONVOY_SHARED_BLOCKS] for s in convoys} == {shared_blocks}
    assert sorted(s.attributes[names.CONVOY_LOADS_AHEAD] for s in convoys) == [1, 2, 3, 4]
    waits_ms = sorted((s.end_time - s.start_time) / 1e6 for s in convoys)
    # Each waited for the first's copy, which its injected delay kept busy.
    assert waits_ms[0] >= LOAD_DELAY_MS * 0.9

    assert backend.export(finished) == SpanExportResult.SUCCESS
    with backend.client() as client:
        answer = _convoys_when_stored(client, len(convoys))
        [engine] = [e for e in answer["engines"] if e["convoys"]]
        assert (engine["convoys"], engine["requests"]) == (len(convoys), len(convoys))
        assert engine["wait_ms_max"] == pytest.approx(waits_ms[-1], abs=0.01)
        assert {item["leader_request_id"] for item in answer["items"]} == {leader}
        assert {item["request_id"] for item in answer["items"]} == waiting
        assert not any(item["shared_load"] for item in answer["items"])
        row_id = answer["items"][0]["id"]
        timeline = client.get(f"/api/v1/requests/{row_id}/timeline").json()
    assert names.LOAD_CONVOY_POINT in timeline["first"]
    assert timeline["first"][names.LOAD_CONVOY_POINT] <= timeline["first"]["transfer_complete"]


def test_a_window_with_no_convoys_is_an_empty_answer(backend):
    with backend.client() as client:
        answer = client.get("/api/v1/stats/convoys", params={"window_s": 1e-3}).json()
    assert (answer["convoys"], answer["engines"], answer["items"]) == (0, [], [])


def _convoys_when_stored(client, count: int, timeout_s: float = 20.0) -> dict:
    """The route's answer once the export's rows are written (ingest runs in workers)."""
    deadline = time.monotonic() + timeout_s
    while True:
        answer = client.get("/api/v1/stats/convoys", params={"window_s": 600}).json()
        if answer["convoys"] >= count or time.monotonic() > deadline:
            return answer
        time.sleep(0.1)
