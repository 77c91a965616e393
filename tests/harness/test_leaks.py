"""harness/leaks.py on real in-process engines: nothing reported once traffic settled, and a
lease a request took and never gave back named by the half that holds it, until it is released."""

import pytest
from vllm.v1.request import Request

from kvscope.harness import configs
from kvscope.harness.engine import in_process_llm
from kvscope.harness.engine_state import engine_scheduler
from kvscope.harness.leaks import engine_leaks
from kvscope.harness.oracle import greedy_params, greedy_tokens
from kvscope.harness.prompts import DISTINCT
from tests.stepping import step_until

pytestmark = pytest.mark.engine
PROMPTS = DISTINCT[:2]
SETTLE_S = 0.5
"""The checker's wait for held() to clear, short here: these leases are held on purpose."""


def settled_leaks(llm) -> list[str]:
    """What the engine holds once its stores committed (an idle engine commits them only when it
    steps), stepping until the checker finds nothing or 30 s passed."""
    found: list[str] = []

    def clean() -> bool:
        found[:] = engine_leaks(llm, settle_s=SETTLE_S)
        return not found

    step_until(llm, clean, still=lambda: found)
    return found


def lease_without_load(llm, prompt: str, req_id: str) -> Request:
    """A request whose prompt the connector has: asked through vLLM's scheduler-side hook, it
    leases the host blocks it would load, then vLLM never allocates it (an engine bug's leak)."""
    core = llm.llm_engine.engine_core.engine_core
    prompt_ids = llm.get_tokenizer().encode(prompt)
    request = Request(
        req_id, prompt_ids, greedy_params(4), None, block_hasher=core.request_block_hasher
    )
    hit_tokens, load_async = engine_scheduler(llm).connector.get_num_new_matched_tokens(request, 0)
    assert hit_tokens > 0 and load_async, "the prompt's blocks should be in the offload pool"
    return request


def finish(llm, request: Request) -> None:
    """vLLM's request_finished for a request that never got blocks: the lease is let go."""
    engine_scheduler(llm).connector.request_finished(request, [])


@pytest.fixture(scope="module")
def offload_llm(tiny_model):
    with in_process_llm(tiny_model, configs.offload_config()) as llm:
        yield llm


def test_an_engine_idle_after_traffic_holds_nothing(offload_llm):
    greedy_tokens(offload_llm, PROMPTS)
    assert settled_leaks(offload_llm) == []


def test_a_lease_left_held_is_named_until_the_request_finishes(offload_llm):
    greedy_tokens(offload_llm, PROMPTS)
    assert settled_leaks(offload_llm) == []
    request = lease_without_load(offload_llm, PROMPTS[0], "held-lease")
    problems = engine_leaks(offload_llm, settle_s=SETTLE_S)
    leased = [p for p in problems if p.startswith("CpuOffloadCore: active_leases = ")]
    assert len(leased) == 1, problems
    assert "CpuOffloadCore: tracked_requests = ['held-lease']" in problems
    assert any(p.startswith("CpuOffloadCore: pinned_host_blocks = ") for p in problems)
    # The scheduler half holds it: vLLM's own state and the worker half know of no such request.
    assert not [p for p in problems if p.startswith(("vLLM", "rank"))], problems
    finish(offload_llm, request)
    assert engine_leaks(offload_llm, settle_s=SETTLE_S) == []
