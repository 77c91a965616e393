"""Connectors at tensor_parallel_size=2 when one rank's copies end steps after the other's:
stores still commit, a load that failed on one rank still fails the request (offload) or falls
back to the next child on every rank (Multi)."""

import json
import os
import time

import pytest

from kvscope.harness import configs
from kvscope.harness.engine import in_process_llm
from kvscope.harness.engine_state import (
    engine_scheduler,
    leaked_device_blocks,
    scheduler_connector,
)
from kvscope.harness.leaks import engine_leaks, worker_leaks
from kvscope.harness.oracle import greedy_tokens, token_mismatches
from kvscope.harness.prompts import DISTINCT
from tests.topology.runs import environ

pytestmark = [pytest.mark.engine, pytest.mark.slow]
PROMPTS = DISTINCT[:3]
SETTLING = ("stores_in_flight", "loads_reported_by_some_ranks", "tracked_requests")
"""What an offload scheduler holds until every rank reported its copies (its held()'s keys)."""
TP2_ENV = {
    # One core per rank: vLLM refuses two CPU workers on one NUMA node otherwise.
    "VLLM_CPU_OMP_THREADS_BIND": "0|1",
    # llm.collective_rpc sends harness.leaks.worker_leaks to the worker processes.
    "VLLM_ALLOW_INSECURE_SERIALIZATION": "1",
}


@pytest.fixture(scope="module")
def faults_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("faults") / "plan.json"
    path.write_text("{}")
    return path


def offload_child(name: str, faults_path, **extra) -> dict:
    extra = {
        "cpu_bytes_to_use": 16 << 20,
        "load_timeout_s": 5.0,
        "faults_path": str(faults_path),
        **extra,
    }
    return configs.offload_child(name, **extra)


def offload_config(faults_path, **extra) -> dict:
    return configs.engine_config(offload_child("offload", faults_path, **extra))


def multi_config(first_faults, second_faults) -> dict:
    """Two offload pools: the second serves what the first fails to load."""
    return configs.multi_config(
        offload_child("first", first_faults), offload_child("second", second_faults)
    )


@pytest.fixture(scope="module")
def expected(tiny_model):
    """Greedy tokens without connector at TP=2 (they may differ from TP=1's)."""
    with environ(**TP2_ENV), in_process_llm(tiny_model, tensor_parallel_size=2) as llm:
        return greedy_tokens(llm, PROMPTS)


@pytest.fixture(scope="module")
def offload_engine(tiny_model, faults_path, expected):
    with environ(**TP2_ENV):
        config = offload_config(faults_path)
        with in_process_llm(tiny_model, config, tensor_parallel_size=2) as llm:
            yield expected, llm


def set_plan(path, plan: dict) -> None:
    path.write_text(json.dumps(plan))
    os.utime(path, ns=(time.time_ns(), time.time_ns()))  # a new mtime even within one tick


def vllm_busy(llm) -> dict:
    """vLLM's own hold (its has_requests, as verify.driver.settle reads it): a request whose
    store ended in the step it finished is freed a step later, when the workers, told to
    flush it, report it in finished_sending."""
    return {"vllm_requests": engine_scheduler(llm).has_requests()}


def settle(llm, timeout_s: float = 30) -> None:
    """Steps the idle engine until every store and load was reported by both ranks and vLLM
    freed every finished request's blocks."""
    offload = scheduler_connector(llm).scheduler
    deadline = time.monotonic() + timeout_s
    while unsettled := {
        what: v
        for what, v in (offload.held() | vllm_busy(llm)).items()
        if v and what in (*SETTLING, "vllm_requests")
    }:
        assert time.monotonic() < deadline, f"never settled: {unsettled}"
        llm.llm_engine.step()
        time.sleep(0.02)


def assert_no_leaks(llm) -> None:
    offload = scheduler_connector(llm).scheduler
    assert offload.leases.active() == [] and offload.pool.stats().reserved == 0
    assert leaked_device_blocks(llm) == 0
    assert llm.collective_rpc(worker_leaks) == [[], []]
    assert engine_leaks(llm) == []


def test_stores_commit_when_one_rank_stores_steps_later(offload_engine, faults_path):
    expected, llm = offload_engine
    set_plan(faults_path, {"by_rank": {"1": {"store_delay_ms": 400.0}}})
    try:
        first = greedy_tokens(llm, PROMPTS)
        settle(llm)
    finally:
        set_plan(faults_path, {})
    offload = scheduler_connector(llm).scheduler
    assert offload.stats["stored_blocks"] >= 2 * len(PROMPTS)
    assert llm.reset_prefix_cache(), "vLLM refused to reset its prefix cache (blocks in use)"
    before = dict(offload.stats)
    again = greedy_tokens(llm, PROMPTS)
    settle(llm)
    assert token_mismatches(expected, first) == [] and token_mismatches(expected, again) == []
    assert offload.stats["loaded_blocks"] - before["loaded_blocks"] >= 2 * len(PROMPTS)
    assert_no_leaks(llm)


def test_a_load_failed_early_on_one_rank_is_recomputed(offload_engine, faults_path):
    expected, llm = offload_engine
    greedy_tokens(llm, PROMPTS)
    settle(llm)
    assert llm.reset_prefix_cache(), "vLLM refused to reset its prefix cache (blocks in use)"
    offload = scheduler_connector(llm).scheduler
    before = dict(offload.stats)
    # Rank 1 fails at once; rank 0 loads correctly, 400 ms later: steps apart.
    set_plan(faults_path, {"by_rank": {"0": {"load_delay_ms": 400.0}, "1": {"fail_load_every": 1}}})
    try:
        again = greedy_tokens(llm, PROMPTS)
        settle(llm)
    finally:
        set_plan(faults_path, {})
    assert token_mismatches(expected, again) == []
    assert offload.stats["failed_loads"] - before["failed_loads"] == len(PROMPTS)
    assert offload.stats["loaded_blocks"] == before["loaded_blocks"]
    assert_no_leaks(llm)


def test_a_load_failed_on_one_rank_falls_back_on_every_rank(tiny_model, expected, tmp_path):
    first, second = tmp_path / "first.json", tmp_path / "second.json"
    set_plan(first, {"by_rank": {"1": {"fail_load_every": 1}}})
    # Rank 1's fallback load ends well after rank 0's: the request must wait for both.
    set_plan(second, {"by_rank": {"1": {"load_delay_ms": 500.0}}})
    config = multi_config(first, second)
    with environ(**TP2_ENV), in_process_llm(tiny_model, config, tensor_parallel_size=2) as llm:
        greedy_tokens(llm, PROMPTS)
        settle_multi(llm)
        assert llm.reset_prefix_cache(), "vLLM refused to reset its prefix cache (blocks in use)"
        again = greedy_tokens(llm, PROMPTS)
        settle_multi(llm)
        children = [child.connector.scheduler for child in scheduler_connector(llm).children]
        assert leaked_device_blocks(llm) == 0
        assert llm.collective_rpc(worker_leaks) == [[], []]
        assert engine_leaks(llm) == []
    assert token_mismatches(expected, again) == []
    assert children[0].stats["failed_loads"] == len(PROMPTS)
    assert children[1].stats["loaded_blocks"] >= 2 * len(PROMPTS)
    for offload in children:
        assert offload.leases.active() == [] and offload.requests == {}


def settle_multi(llm, timeout_s: float = 30) -> None:
    multi = scheduler_connector(llm)
    deadline = time.monotonic() + timeout_s
    while busy := multi_busy(llm, multi):
        assert time.monotonic() < deadline, f"never settled: {busy}"
        llm.llm_engine.step()
        time.sleep(0.02)


def multi_busy(llm, multi) -> dict:
    """The Multi's loads and each child's stores in flight, by name (all falsy when settled)."""
    busy = {"loads": multi.held()["loads"]}
    busy |= {child.name: child.connector.held()["stores_in_flight"] for child in multi.children}
    busy |= vllm_busy(llm)
    return {what: value for what, value in busy.items() if value}
