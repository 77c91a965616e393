"""MultiConnector in a real CPU engine: composition, fallback on a failed load, who served what."""

import pytest

from kvscope.harness.configs import child, multi_config, offload_child
from kvscope.harness.engine import in_process_llm
from kvscope.harness.engine_state import leaked_device_blocks, scheduler_connector
from kvscope.harness.oracle import greedy_tokens, token_mismatches
from kvscope.harness.prompts import DISTINCT
from kvscope.traces import names
from tests.oracle_cache import prompt_set
from tests.stepping import step_until_prefix_cache_reset

pytestmark = pytest.mark.engine
BASELINE = prompt_set(DISTINCT)


@pytest.fixture(scope="module")
def expected(oracle):
    return oracle.tokens(BASELINE)


def two_passes(llm) -> list[list[int]]:
    """Store on the first pass; the second, after a prefix cache reset, loads."""
    greedy_tokens(llm, DISTINCT)
    step_until_prefix_cache_reset(llm)  # asynchronous stores commit meanwhile
    return greedy_tokens(llm, DISTINCT)


def assert_children_clean(llm) -> None:
    for named in scheduler_connector(llm).children:
        offload = getattr(named.connector, "scheduler", None)
        if offload is not None:
            assert offload.leases.active() == [] and offload.requests == {}, named.name
    assert leaked_device_blocks(llm) == 0


def events_named(spans, name: str) -> list[dict]:
    return [dict(e.attributes) for s in spans for e in s.events if e.name == name]


def test_vllm_example_connector_beside_ours(tiny_model, tmp_path, expected, spans):
    example = child("example", "ExampleConnector", None, shared_storage_path=str(tmp_path))
    with in_process_llm(tiny_model, multi_config(offload_child("offload"), example)) as llm:
        again = two_passes(llm)
        assert_children_clean(llm)
    assert token_mismatches(expected, again) == []
    routed = events_named(spans(), "kvscope.multi.load_routed")
    assert {e[names.CONNECTOR_CHILD] for e in routed} == {"offload"}
    children = {s.attributes.get(names.CONNECTOR_CHILD) for s in spans()}
    assert {"offload", "example"} <= children, "each child's hooks have spans of their own"


def test_a_failed_load_falls_back_to_the_next_child(tiny_model, expected, spans):
    failing = offload_child("first", faults={"fail_load_every": 1})
    config = multi_config(failing, offload_child("second"))
    with in_process_llm(tiny_model, config) as llm:
        again = two_passes(llm)
        second = scheduler_connector(llm).children[1].connector.scheduler
        assert second.stats["loaded_blocks"] >= 2 * len(DISTINCT)
        assert_children_clean(llm)
    assert token_mismatches(expected, again) == []
    failures = events_named(spans(), names.EVENT_LOAD_FAILED)
    fallbacks = [f for f in failures if f.get(names.FAILURE_OUTCOME) == "served_by_fallback"]
    assert len(fallbacks) == len(DISTINCT)
    assert all(f["kvscope.multi.fallback_child"] == "second" for f in fallbacks)


def test_with_no_child_to_fall_back_to_the_policy_recomputes(tiny_model, expected, spans):
    failing = offload_child("only", faults={"fail_load_every": 1})
    with in_process_llm(tiny_model, multi_config(failing)) as llm:
        again = two_passes(llm)
        assert_children_clean(llm)
    assert token_mismatches(expected, again) == []
    outcomes = {
        f.get(names.FAILURE_OUTCOME) for f in events_named(spans(), names.EVENT_LOAD_FAILED)
    }
    assert "recomputed" in outcomes


def test_child_spans_nest_under_the_multi_hook_span(tiny_model, spans):
    with in_process_llm(tiny_model, multi_config(offload_child("a"), offload_child("b"))) as llm:
        greedy_tokens(llm, DISTINCT[:1])
    collected = spans()
    by_id = {s.context.span_id: s for s in collected}
    lookup = names.SPAN_HOOK_PREFIX + "get_num_new_matched_tokens"
    child_lookups = [
        s for s in collected if s.attributes.get(names.CONNECTOR_CHILD) and s.name == lookup
    ]
    assert {s.attributes[names.CONNECTOR_CHILD] for s in child_lookups} == {"a", "b"}
    for span in child_lookups:
        parent = by_id[span.parent.span_id]
        assert parent.name == span.name and parent.attributes[names.CONNECTOR_NAME] == "MultiCore"
