"""CPU offload connector in a real CPU engine: greedy tokens equal no connector, come what may."""

import pytest

from kvscope.harness.configs import offload_config
from kvscope.harness.engine import in_process_llm
from kvscope.harness.engine_state import leaked_device_blocks, scheduler_connector, worker_connector
from kvscope.harness.oracle import greedy_params, greedy_tokens, token_mismatches
from kvscope.harness.prompts import DISTINCT, long_prompt
from kvscope.traces import names
from tests.oracle_cache import prompt_set
from tests.stepping import step_until

pytestmark = pytest.mark.engine
SHARED = [long_prompt(0, 3) + f" Then question {i} asks something else entirely." for i in range(6)]
BASELINES = {"distinct": prompt_set(DISTINCT), "shared": prompt_set(SHARED)}


@pytest.fixture(scope="module")
def expected(oracle):
    """Greedy tokens of every prompt set without any connector."""
    return {name: oracle.tokens(prompts) for name, prompts in BASELINES.items()}


def assert_no_leaks(llm) -> None:
    offload = scheduler_connector(llm).scheduler
    assert offload.leases.active() == []
    assert offload.requests == {}
    assert offload.stores.in_flight == {}
    assert leaked_device_blocks(llm) == 0
    assert worker_connector(llm).worker._pending == {}


def wait_for_stores(llm) -> None:
    """Stores commit a step or two after the forward: step the idle engine until they have."""
    offload = scheduler_connector(llm).scheduler
    step_until(
        llm,
        lambda: not offload.stores.in_flight,
        still=lambda: f"stores {offload.stores.in_flight}",
    )


def test_hits_after_prefix_cache_reset_give_the_same_tokens(tiny_model, expected, spans):
    with in_process_llm(tiny_model, offload_config()) as llm:
        first = greedy_tokens(llm, DISTINCT)
        wait_for_stores(llm)
        llm.reset_prefix_cache()
        second = greedy_tokens(llm, DISTINCT)
        stats = scheduler_connector(llm).scheduler.stats
        assert_no_leaks(llm)
    assert token_mismatches(expected["distinct"], first) == []
    assert token_mismatches(expected["distinct"], second) == []
    assert stats["hit_tokens"] >= 64 * len(DISTINCT)
    assert stats["loaded_blocks"] >= 2 * len(DISTINCT)
    loads = [
        s
        for s in spans()
        if s.name == names.SPAN_TRANSFER and s.attributes[names.TRANSFER_DIRECTION] == "load"
    ]
    assert len(loads) == len(DISTINCT) and all(s.attributes[names.TRANSFER_OK] for s in loads)


def test_a_pool_too_small_evicts_and_stays_correct(tiny_model, expected):
    # 2 layers x 32 tokens x 2 KV heads x 64 values x 2 bytes = 16 KiB a block: room for 5.
    with in_process_llm(tiny_model, offload_config(cpu_bytes_to_use=5 * 16384)) as llm:
        greedy_tokens(llm, DISTINCT)
        wait_for_stores(llm)
        llm.reset_prefix_cache()
        again = greedy_tokens(llm, DISTINCT)
        pool = scheduler_connector(llm).scheduler.pool
        assert pool.num_blocks == 5
        assert pool._counters.evicted_blocks > 0
        assert_no_leaks(llm)
    assert token_mismatches(expected["distinct"], again) == []


def test_concurrent_requests_sharing_a_prefix(tiny_model, expected):
    with in_process_llm(tiny_model, offload_config()) as llm:
        greedy_tokens(llm, SHARED[:1])
        wait_for_stores(llm)
        llm.reset_prefix_cache()
        together = greedy_tokens(llm, SHARED)
        assert scheduler_connector(llm).scheduler.stats["hit_tokens"] > 0
        assert_no_leaks(llm)
    assert token_mismatches(expected["shared"], together) == []


def test_failed_loads_are_recomputed(tiny_model, expected, spans):
    config = offload_config(faults={"fail_load_every": 2})
    with in_process_llm(tiny_model, config) as llm:
        greedy_tokens(llm, DISTINCT)
        wait_for_stores(llm)
        llm.reset_prefix_cache()
        again = greedy_tokens(llm, DISTINCT)
        assert scheduler_connector(llm).scheduler.stats["failed_loads"] >= 1
        assert_no_leaks(llm)
    assert token_mismatches(expected["distinct"], again) == []
    failures = [
        e.attributes for s in spans() for e in s.events if e.name == names.EVENT_LOAD_FAILED
    ]
    assert any(f[names.FAILURE_CAUSE].startswith("InjectedFault") for f in failures)
    assert any(f.get(names.FAILURE_POLICY) == "recompute" for f in failures)


def test_failed_loads_fail_the_request_under_fail_policy(tiny_model):
    config = offload_config("fail", faults={"fail_load_every": 1})
    with in_process_llm(tiny_model, config) as llm:
        greedy_tokens(llm, DISTINCT[:1])
        wait_for_stores(llm)
        llm.reset_prefix_cache()
        outputs = llm.generate(DISTINCT[:1], greedy_params(8), use_tqdm=False)
        assert outputs[0].outputs[0].finish_reason == "error"
        assert_no_leaks(llm)


def test_eviction_of_a_leased_block_is_refused_and_the_hit_served(tiny_model, expected, spans):
    with in_process_llm(tiny_model, offload_config(faults={"evict_leased": True})) as llm:
        greedy_tokens(llm, DISTINCT)
        wait_for_stores(llm)
        llm.reset_prefix_cache()
        again = greedy_tokens(llm, DISTINCT)
        offload = scheduler_connector(llm).scheduler
        assert offload.pool.eviction_refused >= 2 * len(DISTINCT)
        assert offload.stats["loaded_blocks"] >= 2 * len(DISTINCT)
        assert_no_leaks(llm)
    assert token_mismatches(expected["distinct"], again) == []
    refused = [e for s in spans() for e in s.events if e.name == names.EVENT_EVICTION_REFUSED]
    assert refused


def test_a_load_past_its_timeout_is_cancelled_and_recomputed(tiny_model, expected, spans):
    faults = {"load_delay_ms": 3000.0}
    with in_process_llm(tiny_model, offload_config(load_timeout_s=0.3, faults=faults)) as llm:
        greedy_tokens(llm, DISTINCT[:1])
        wait_for_stores(llm)
        llm.reset_prefix_cache()
        again = greedy_tokens(llm, DISTINCT[:1])
        assert scheduler_connector(llm).scheduler.stats["failed_loads"] == 1
        assert_no_leaks(llm)
    assert token_mismatches(expected["distinct"][:1], again) == []
    causes = [e.attributes.get(names.FAILURE_CAUSE) for s in spans() for e in s.events]
    assert "timeout" in causes


def test_a_lease_expiring_mid_load_is_reported_and_the_load_stays_safe(tiny_model, expected, spans):
    faults = {"load_delay_ms": 300.0}
    config = offload_config(lease_timeout_s=0.05, faults=faults)
    with in_process_llm(tiny_model, config) as llm:
        greedy_tokens(llm, DISTINCT)
        wait_for_stores(llm)
        llm.reset_prefix_cache()
        again = greedy_tokens(llm, DISTINCT)
        offload = scheduler_connector(llm).scheduler
        assert offload.leases.counters().expired >= 1
        assert offload.pool.stats().pinned == 0
        assert_no_leaks(llm)
    assert token_mismatches(expected["distinct"], again) == []
    expired = [e for s in spans() for e in s.events if e.name == names.EVENT_LEASE_EXPIRED]
    assert expired and expired[0].attributes[names.LEASE_OUTCOME] == "expired"
