"""vLLM's stock NixlConnector and kvscope's CPU offload as children of one KvscopeMultiConnector,
on real prefill and decode servers: the NIXL child hands the KV over, the offload child keeps it."""

import os
import time

import httpx
import pytest

from kvscope.bench.pd.pd_pair import metric
from kvscope.harness.configs import multi_config, offload_child
from kvscope.harness.engine import ServerProcess, engine_env, free_port, serve_command
from kvscope.harness.prompts import long_prompt
from kvscope.traces import names
from kvscope.traces.sdk.otlp_json import read_spans_file
from tests.connector.p2p.pd_client import (
    completion_body,
    greedy_via,
    prefill_only,
    wait_until_no_blocks_held,
)
from tests.oracle_cache import prompt_set

pytestmark = [pytest.mark.engine, pytest.mark.slow, pytest.mark.timeout(900)]
PROMPT = long_prompt(3, sentences=6)
MAX_TOKENS = 12
BASELINE = prompt_set([PROMPT], MAX_TOKENS)
CHILDREN = [
    # vLLM's own child format, as in its MultiConnector docs: kv_role and kv_buffer_device.
    {
        "name": "nixl",
        "kv_connector": "NixlConnector",
        "kv_role": "kv_both",
        "kv_buffer_device": "cpu",
    },
    offload_child(cpu_bytes_to_use=64 << 20),
]
MULTI = multi_config(*CHILDREN)


@pytest.fixture(scope="module")
def expected(oracle):
    return oracle.tokens(BASELINE)[0]


def launch(tiny_model, workdir, role: str, core: int) -> ServerProcess:
    """One server pinned to one core: vLLM's NIXL agent spins a core per server (PLATFORM.md)."""
    env = engine_env(
        VLLM_NIXL_SIDE_CHANNEL_PORT=str(free_port()),
        VLLM_NIXL_SIDE_CHANNEL_HOST="127.0.0.1",
        VLLM_SERVER_DEV_MODE="1",
        KVSCOPE_TRACES_FILE=str(workdir / f"{role}.jsonl"),
        OTEL_BSP_SCHEDULE_DELAY="100",
    )
    port = free_port()
    cmd = ["taskset", "-c", str(core), *serve_command(tiny_model, port, MULTI)]
    return ServerProcess(cmd, port, env, workdir / f"{role}.log")


@pytest.fixture(scope="module")
def pair(tiny_model, tmp_path_factory, expected):
    workdir = tmp_path_factory.mktemp("multi-nixl-pd")
    cores = sorted(os.sched_getaffinity(0))
    servers = []
    try:
        for index, role in enumerate(("prefill", "decode")):
            servers.append(launch(tiny_model, workdir, role, cores[index % len(cores)]))
        for server in servers:
            server.wait_ready(400)
        yield servers, workdir
    finally:
        for server in servers:
            server.stop()


def routed_children(workdir, role: str) -> list[str]:
    """Which child served each load on one server, in order."""
    time.sleep(0.5)  # the span exporter writes every 100 ms
    spans = sorted(read_spans_file(workdir / f"{role}.jsonl"), key=lambda s: s["start_ns"])
    return [
        e[names.CONNECTOR_CHILD]
        for s in spans
        for e in s["events"]
        if e["name"] == "kvscope.multi.load_routed"
    ]


def prompt_length(url: str, model, prompt: str) -> int:
    answer = httpx.post(url + "/tokenize", json={"model": str(model), "prompt": prompt}, timeout=30)
    answer.raise_for_status()
    return len(answer.json()["tokens"])


@pytest.fixture(scope="module")
def disaggregated(pair, tiny_model):
    """The request through both legs, as the P/D proxy sends it, and the decode side's hits."""
    (prefill, decode), _ = pair
    body = completion_body(tiny_model, PROMPT, MAX_TOKENS)
    hits_before = metric(decode.url, "vllm:external_prefix_cache_hits_total")
    params = prefill_only(prefill.url, body)
    tokens = greedy_via(decode.url, {**body, "kv_transfer_params": params})
    hits = metric(decode.url, "vllm:external_prefix_cache_hits_total") - hits_before
    return tokens, params, hits


def test_greedy_tokens_equal_a_single_engines(disaggregated, expected):
    tokens, params, _ = disaggregated
    assert params["do_remote_prefill"] and params["remote_block_ids"], params
    assert tokens == expected


def test_the_decode_side_served_the_prompt_from_the_nixl_child(pair, disaggregated, tiny_model):
    (prefill, decode), workdir = pair
    _, _, hits = disaggregated
    # Stock NIXL hands over every prompt token: the decode side computes none (PLATFORM.md).
    assert hits == prompt_length(decode.url, tiny_model, PROMPT)
    assert routed_children(workdir, "decode") == ["nixl"]
    wait_until_no_blocks_held([prefill.url, decode.url], timeout_s=30)


def test_the_nixl_childs_stats_reach_vllms_metrics(pair, disaggregated):
    """Worker stats travel to the API server as data; the Multi rebuilds them per child."""
    _, decode = pair[0]
    deadline = time.monotonic() + 20
    while metric(decode.url, "vllm:nixl_bytes_transferred_count") == 0:
        assert time.monotonic() < deadline, "no NIXL transfer in the decode server's metrics"
        time.sleep(0.5)
    assert metric(decode.url, "vllm:nixl_bytes_transferred_sum") > 0


def test_the_offload_child_serves_the_prefix_later(pair, disaggregated, tiny_model, expected):
    """The decode side's offload child stored what NIXL brought: with the local prefix cache
    emptied, a request sent straight to decode loads it from the offload pool."""
    (_, decode), workdir = pair
    time.sleep(1.0)  # the offload child's asynchronous stores commit
    httpx.post(decode.url + "/reset_prefix_cache", timeout=30).raise_for_status()
    assert greedy_via(decode.url, completion_body(tiny_model, PROMPT, MAX_TOKENS)) == expected
    assert routed_children(workdir, "decode") == ["nixl", "offload"]
