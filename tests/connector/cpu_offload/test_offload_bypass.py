"""A sick host pool in a real CPU engine: loads slower than their timeout bypass it (lookups
answer 0 at once), the span and the Prometheus metric say so, a later probe restores it, and
greedy tokens equal a run without the connector throughout."""

import time

import prometheus_client
import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvscope.connector.common.tier_health import TierState
from kvscope.harness.configs import offload_config
from kvscope.harness.engine import in_process_llm
from kvscope.harness.engine_state import scheduler_connector, worker_connector
from kvscope.harness.oracle import greedy_tokens, token_mismatches
from kvscope.harness.prompts import DISTINCT
from kvscope.traces import names
from tests.oracle_cache import prompt_set
from tests.reliability.engine_ops import set_faults
from tests.stepping import step_until

pytestmark = [pytest.mark.engine, pytest.mark.timeout(300)]
LOAD_TIMEOUT_S = 2.0
SLOW_LOADS = {"load_delay_ms": 5000.0}  # past the load timeout: each load fails at 2 s
TIER_HEALTH = {"failures_to_bypass": 3, "bypass_s": 1.0, "max_bypass_s": 8.0}
BASELINE = prompt_set(DISTINCT)


def bypass_config(faults_path) -> dict:
    return offload_config(
        load_timeout_s=LOAD_TIMEOUT_S, faults_path=str(faults_path), tier_health=TIER_HEALTH
    )


def settle(llm, timeout_s: float = 30.0) -> None:
    """Steps the idle engine until no copy is in flight (timed-out ones included) and vLLM's
    prefix cache is reset, so the next pass asks the host pool."""
    offload, worker = scheduler_connector(llm).scheduler, worker_connector(llm).worker
    step_until(
        llm,
        lambda: (
            not (offload.stores.in_flight or worker.held()["copies_pending"])
            and llm.reset_prefix_cache()
        ),
        timeout_s,
        lambda: f"in flight: stores {offload.stores.in_flight}, worker {worker.held()}",
        pause_s=0.01,
    )


def timed_pass(llm) -> tuple[list[list[int]], float]:
    started = time.monotonic()
    tokens = greedy_tokens(llm, DISTINCT)
    return tokens, time.monotonic() - started


def scrape() -> dict[str, float]:
    """The offload tier's samples on vLLM's own Prometheus registry, as /metrics shows them."""
    text = prometheus_client.generate_latest(prometheus_client.REGISTRY).decode()
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if "kvscope_offload_tier" in sample.name
    }


def tier_states(spans) -> list[dict]:
    return [
        dict(s.attributes)
        for s in spans()
        if s.name == names.SPAN_TIER_HEALTH and s.attributes[names.TIER] == "cpu_offload"
    ]


@pytest.fixture(scope="module")
def expected(oracle):
    return oracle.tokens(BASELINE)


def test_a_sick_pool_is_bypassed_then_probed_back(tiny_model, tmp_path, expected, spans):
    faults_path = tmp_path / "faults.json"
    set_faults(faults_path, {})
    with in_process_llm(tiny_model, bypass_config(faults_path)) as llm:
        offload = scheduler_connector(llm).scheduler
        assert token_mismatches(expected, greedy_tokens(llm, DISTINCT)) == []  # stores
        settle(llm)
        set_faults(faults_path, SLOW_LOADS)
        sick, sick_s = timed_pass(llm)  # 3 loads time out: 3 failures in a row
        assert offload.health.state is TierState.BYPASSED
        failed, leases = offload.stats["failed_loads"], offload.leases.counters().acquired
        assert failed == 3 and sick_s >= LOAD_TIMEOUT_S
        settle(llm)
        bypassed, bypassed_s = timed_pass(llm)
        assert offload.health.state is TierState.BYPASSED, "the bypass outlasts this pass"
        # Lookups answered 0 at once: no lease, no load, no wait for a timeout.
        assert offload.leases.counters().acquired == leases
        assert offload.stats["failed_loads"] == failed and bypassed_s < LOAD_TIMEOUT_S
        assert offload.health.bypassed_lookups >= len(DISTINCT)
        metrics = scrape()
        set_faults(faults_path, {})
        time.sleep(max(0.0, offload.health.bypassed_until - time.monotonic()))
        settle(llm)
        loaded = offload.stats["loaded_blocks"]
        probed = greedy_tokens(llm, DISTINCT)  # the first lookup probes; its load succeeds
        assert offload.health.state is TierState.HEALTHY
        assert offload.stats["loaded_blocks"] > loaded
        settle(llm)
        healthy = greedy_tokens(llm, DISTINCT)
        assert offload.leases.counters().acquired >= leases + 1 + len(DISTINCT)
        after = scrape()
    for tokens in (sick, bypassed, probed, healthy):
        assert token_mismatches(expected, tokens) == []
    assert metrics["vllm:kvscope_offload_tier_bypassed"] == 1
    assert metrics["vllm:kvscope_offload_tier_bypasses_total"] == 1
    assert metrics["vllm:kvscope_offload_tier_bypassed_lookups_total"] >= len(DISTINCT)
    assert after["vllm:kvscope_offload_tier_bypassed"] == 0
    states = tier_states(spans)
    assert [s[names.TIER_STATE] for s in states] == ["bypassed", "probing", "healthy"]
    assert states[0][names.TIER_FAILURES] == 3 and states[0][names.TIER_BYPASS_S] == 1.0
    assert "timed out after 2." in states[0][names.TIER_REASON]
    assert states[2][names.TIER_FAILURES] == 0 and states[2][names.TIER_BYPASS_S] == 0.0
