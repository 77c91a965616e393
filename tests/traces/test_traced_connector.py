"""TracedConnector over vLLM's ExampleConnector in a real CPU engine: hooks, order, attributes."""

from collections import defaultdict

import pytest

from kvscope.demo.quickstart import traced_example_config
from kvscope.harness.engine import in_process_llm
from kvscope.harness.oracle import greedy_tokens, token_mismatches
from kvscope.harness.prompts import DISTINCT
from kvscope.traces import names

pytestmark = pytest.mark.engine
HOOK = names.SPAN_HOOK_PREFIX


@pytest.fixture(scope="module")
def two_passes(tiny_model, tmp_path_factory, span_exporter):
    """Runs DISTINCT without a connector, then twice with one: miss+store, then hit+load."""
    from kvscope.traces.sdk.configure import flush

    with in_process_llm(tiny_model) as llm:
        expected = greedy_tokens(llm, DISTINCT)
    config = traced_example_config(tmp_path_factory.mktemp("example-kv"))
    span_exporter.clear()
    with in_process_llm(tiny_model, config) as llm:
        first = greedy_tokens(llm, DISTINCT)
        flush()
        first_spans = list(span_exporter.get_finished_spans())
        span_exporter.clear()
        llm.reset_prefix_cache()
        second = greedy_tokens(llm, DISTINCT)
        flush()
        second_spans = list(span_exporter.get_finished_spans())
    return expected, (first, first_spans), (second, second_spans)


def by_request(spans) -> dict[str, list]:
    grouped = defaultdict(list)
    for span in spans:
        if req_id := span.attributes.get(names.REQUEST_ID):
            grouped[req_id].append(span)
    return grouped


def named(spans, hook: str) -> list:
    return sorted((s for s in spans if s.name == HOOK + hook), key=lambda s: s.start_time)


def test_tokens_equal_without_connector_in_both_passes(two_passes):
    expected, (first, _), (second, _) = two_passes
    assert token_mismatches(expected, first) == []
    assert token_mismatches(expected, second) == []


def test_first_pass_misses_and_stores(two_passes):
    _, (_, spans), _ = two_passes
    lookups = named(spans, "get_num_new_matched_tokens")
    assert len(lookups) >= len(DISTINCT)
    assert all(s.attributes[names.TOKENS_EXTERNAL_HIT] == 0 for s in lookups)
    assert named(spans, "save_kv_layer"), "the connector's per-layer saves were traced"
    save = named(spans, "save_kv_layer")[0]
    assert save.attributes[names.LAYER_COUNT] == 2  # the tiny model has two layers
    assert save.attributes[names.TRACE_MODE] == "aggregated"


def test_second_pass_hits_and_loads(two_passes):
    _, _, (_, spans) = two_passes
    for req_id, request_spans in by_request(spans).items():
        lookup = named(request_spans, "get_num_new_matched_tokens")[-1]
        assert lookup.attributes[names.TOKENS_EXTERNAL_HIT] >= 64, req_id
        alloc = named(request_spans, "update_state_after_alloc")[-1]
        assert (
            alloc.attributes[names.TOKENS_TO_LOAD] == lookup.attributes[names.TOKENS_EXTERNAL_HIT]
        )
        assert alloc.attributes[names.BLOCK_COUNT] >= 2


def test_hooks_run_in_the_order_vllm_documents(two_passes):
    """Per request: lookup, allocation, metadata, worker load/forward/save, finish."""
    _, _, (_, spans) = two_passes
    steps = {s.attributes[names.STEP]: s for s in spans if s.name == names.SPAN_STEP}
    for req_id, request_spans in by_request(spans).items():
        lookup = named(request_spans, "get_num_new_matched_tokens")[0]
        alloc = named(request_spans, "update_state_after_alloc")[0]
        finished = named(request_spans, "request_finished")[0]
        work = next(s for s in request_spans if s.name == names.SPAN_WORKER_REQUEST)
        step = steps[work.attributes[names.STEP]]
        meta = next(
            s
            for s in named(spans, "build_connector_meta")
            if s.attributes[names.STEP] == work.attributes[names.STEP]
        )
        in_step = [s for s in spans if s.parent and s.parent.span_id == step.context.span_id]
        load, save = named(in_step, "start_load_kv")[0], named(in_step, "wait_for_save")[0]
        layers = named(in_step, "wait_for_layer_load")[0]
        assert lookup.start_time < alloc.start_time < meta.start_time < step.start_time, req_id
        # ExampleConnector loads synchronously: start_load_kv runs before the forward.
        assert load.end_time <= layers.start_time <= save.start_time, req_id
        assert step.end_time <= finished.start_time, req_id


def test_hook_spans_are_children_of_their_request_span(two_passes):
    _, (_, spans), _ = two_passes
    requests = {s.attributes[names.REQUEST_ID]: s for s in spans if s.name == names.SPAN_REQUEST}
    assert len(requests) == len(DISTINCT)
    for req_id, request_spans in by_request(spans).items():
        root = requests[req_id]
        for span in request_spans:
            assert span.context.trace_id == root.context.trace_id, (req_id, span.name)
        hooks = [s for s in request_spans if s.name.startswith(HOOK)]
        assert {s.parent.span_id for s in hooks} == {root.context.span_id}


def test_step_spans_link_to_their_requests(two_passes):
    _, (_, spans), _ = two_passes
    requests = {s.context.span_id for s in spans if s.name == names.SPAN_REQUEST}
    metas = named(spans, "build_connector_meta")
    linked = {link.context.trace_id for meta in metas for link in meta.links}
    traces = {s.context.trace_id for s in spans if s.context.span_id in requests}
    assert linked == traces


def test_timeline_events_reach_the_worker_request_spans(two_passes):
    _, _, (_, spans) = two_passes
    points = defaultdict(set)
    for span in spans:
        if span.name == names.SPAN_WORKER_REQUEST:
            for event in span.events:
                points[span.attributes[names.REQUEST_ID]].add(
                    event.attributes[names.TIMELINE_POINT]
                )
    assert len(points) == len(DISTINCT)
    for req_points in points.values():
        assert {"transfer_submitted", "forward_start", "layer_ready"} <= req_points
