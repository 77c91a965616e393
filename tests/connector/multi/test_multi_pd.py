"""P2P + CPU offload in a Multi on real prefill and decode servers: the first request is served
by P2P through the proxy, a later one with the same prefix by the decode side's offload pool."""

import time

import httpx
import pytest

from kvscope.bench.pd.pd_pair import ProxyThread
from kvscope.harness.configs import demo_config
from kvscope.harness.engine import ServerProcess, engine_env, free_port, serve_command
from kvscope.harness.prompts import long_prompt
from kvscope.traces import names
from kvscope.traces.sdk.otlp_json import read_spans_file
from tests.connector.p2p.pd_client import wait_until_no_blocks_held
from tests.oracle_cache import prompt_set

pytestmark = [pytest.mark.engine, pytest.mark.slow]
PROMPT = long_prompt(1, sentences=6)
MAX_TOKENS = 12
BASELINE = prompt_set([PROMPT], MAX_TOKENS)


@pytest.fixture(scope="module")
def expected(oracle):
    return oracle.tokens(BASELINE)[0]


@pytest.fixture(scope="module")
def pair(tiny_model, tmp_path_factory):
    """Prefill and decode servers with the demo's Multi (P2P first, then offload), a proxy."""
    workdir = tmp_path_factory.mktemp("multi-pd")
    (workdir / "faults.json").write_text("{}")
    servers = []
    try:
        for role in ("prefill", "decode"):
            config = demo_config(free_port(), workdir / "faults.json")
            env = engine_env(
                KVSCOPE_TRACES_FILE=str(workdir / f"{role}.jsonl"),
                OTEL_BSP_SCHEDULE_DELAY="100",
                VLLM_SERVER_DEV_MODE="1",
            )
            port = free_port()
            cmd = serve_command(tiny_model, port, config)
            servers.append(ServerProcess(cmd, port, env, workdir / f"{role}.log"))
        for server in servers:
            server.wait_ready(400)
        proxy = ProxyThread(servers[0].url, servers[1].url)
        yield servers, proxy, workdir
        proxy.stop()
    finally:
        for server in servers:
            server.stop()


def complete(url: str, model, prompt: str) -> list[int]:
    body = {
        "model": str(model),
        "prompt": prompt,
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "ignore_eos": True,
        "return_token_ids": True,
    }
    answer = httpx.post(url + "/v1/completions", json=body, timeout=120)
    answer.raise_for_status()
    return list(answer.json()["choices"][0]["token_ids"])


def routed_children(workdir, role: str) -> list[str]:
    """Which child served each load on one server, in order."""
    time.sleep(0.5)
    spans = sorted(read_spans_file(workdir / f"{role}.jsonl"), key=lambda s: s["start_ns"])
    return [
        e[names.CONNECTOR_CHILD]
        for s in spans
        for e in s["events"]
        if e["name"] == "kvscope.multi.load_routed"
    ]


def test_p2p_serves_first_then_the_offload_pool(pair, tiny_model, expected):
    (prefill, decode), proxy, workdir = pair
    assert complete(proxy.url, tiny_model, PROMPT) == expected
    assert routed_children(workdir, "decode") == ["p2p"]
    # The decode side stored the pulled blocks in its pool; empty its local prefix cache so
    # only the pool can serve the prefix to a request sent straight to it.
    time.sleep(1.0)
    httpx.post(decode.url + "/reset_prefix_cache", timeout=30).raise_for_status()
    assert complete(decode.url, tiny_model, PROMPT) == expected
    assert routed_children(workdir, "decode") == ["p2p", "offload"]
    wait_until_no_blocks_held([prefill.url, decode.url], timeout_s=30)
