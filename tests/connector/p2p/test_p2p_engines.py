"""Two real vLLM servers on the CPU with the P2P connector, and the P/D proxy between them."""

import os
import signal
import socket
import time

import httpx
import pytest

from kvscope.bench.pd.pd_pair import PDPair, ProxyThread, free_port, metric, p2p_transfer_config
from kvscope.harness.engine import ServerProcess, engine_env, serve_command
from kvscope.harness.prompts import long_prompt
from kvscope.traces import names
from kvscope.traces.sdk.otlp_json import read_spans_file
from tests.connector.p2p.pd_client import (
    completion_body,
    greedy_via,
    prefill_only,
    streamed_chunks,
    wait_until_no_blocks_held,
)
from tests.connector.prom_scrape import total, wait_for
from tests.oracle_cache import prompt_set

pytestmark = [pytest.mark.engine, pytest.mark.slow]

MAX_TOKENS = 12
LONG_TOKENS = 48
LEASE_S = 15.0  # generous: on a loaded 2-core machine a pull can take seconds
CONNECTOR = {
    "lease_timeout_s": LEASE_S,
    "lease_margin_s": 1.0,
    "read_timeout_s": 6.0,
    "handshake_timeout_s": 4.0,
}
# Distinct first blocks, so the decode server never has a local prefix hit.
PROMPTS = [long_prompt(i, sentences=3 + i) for i in range(3)]
BYTES_PER_BLOCK = 2 * 2 * 32 * 64 * 2  # layers, KV heads, tokens, K and V dims, bf16
FAULT_NAMES = ["expired", "silent", "stopped", "killed", "stream"]
FAULTS = {name: f"Fault case {name}: " + long_prompt(i + 1) for i, name in enumerate(FAULT_NAMES)}
# Each prompt alone, as the tests send them: vLLM's CPU kernels are not batch-invariant.
BASELINES = {
    **{i: prompt_set([prompt], MAX_TOKENS) for i, prompt in enumerate(PROMPTS)},
    **{name: prompt_set([prompt], MAX_TOKENS) for name, prompt in FAULTS.items()},
    "stream_long": prompt_set([FAULTS["stream"]], LONG_TOKENS),
}


@pytest.fixture(scope="module")
def expected(oracle):
    """A single server's greedy tokens for every prompt (in-process engine, no connector)."""
    return {key: oracle.tokens(prompts)[0] for key, prompts in BASELINES.items()}


@pytest.fixture(scope="module")
def fail_decode(tiny_model, tmp_path_factory):
    """A second decode server, with kv_load_failure_policy 'fail': launched before the pair
    (pd asks for it), so it boots beside the pair rather than after it; always stopped."""
    port = free_port()
    config = p2p_transfer_config(free_port(), policy="fail", **CONNECTOR)
    log = tmp_path_factory.mktemp("pd-fail") / "decode-fail.log"
    server = ServerProcess(serve_command(tiny_model, port, config), port, engine_env(), log)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def pd(tiny_model, tmp_path_factory, expected, fail_decode):
    """One prefill+decode pair and the proxy for the whole module; always stopped."""
    workdir = tmp_path_factory.mktemp("pd")
    env = {"OTEL_BSP_SCHEDULE_DELAY": "100"}
    pair = PDPair(tiny_model, workdir, extra=CONNECTOR, env=env, spans_to_files=True).start(400)
    proxy = None
    try:
        proxy = ProxyThread(pair.prefill.url, pair.decode.url)
        yield pair, proxy
    finally:
        if proxy is not None:
            proxy.stop()
        pair.stop()


@pytest.fixture(scope="module")
def happy(pd, tiny_model, expected):
    """The prompts through the proxy, plus the decode server's external hits while serving them."""
    pair, proxy = pd
    hits_before = metric(pair.decode.url, "vllm:external_prefix_cache_hits_total")
    outputs, prompt_lengths = [], []
    for prompt in PROMPTS:
        body = completion_body(tiny_model, prompt, MAX_TOKENS)
        outputs.append(greedy_via(proxy.url, body))
        prompt_lengths.append(len(greedy_prompt_ids(pair.decode.url, tiny_model, prompt)))
    hits = metric(pair.decode.url, "vllm:external_prefix_cache_hits_total") - hits_before
    return outputs, prompt_lengths, hits


def greedy_prompt_ids(url: str, model, prompt: str) -> list[int]:
    answer = httpx.post(url + "/tokenize", json={"model": str(model), "prompt": prompt}, timeout=30)
    return answer.json()["tokens"]


def spans_of(pair: PDPair, role: str) -> list[dict]:
    time.sleep(0.5)  # the exporter writes every 100 ms
    return read_spans_file(pair.spans_file(role))


def test_greedy_tokens_through_the_proxy_equal_a_single_servers(happy, expected):
    outputs, _, _ = happy
    assert outputs == [expected[i] for i in range(len(PROMPTS))]


def test_decode_server_pulled_every_prompt_token_but_the_last(happy):
    _, prompt_lengths, hits = happy
    assert hits == sum(n - 1 for n in prompt_lengths)


def test_the_kv_bytes_moved_through_nixl(pd, happy):
    pair, _ = pd
    _, prompt_lengths, _ = happy
    reads = [s["attributes"] for s in spans_of(pair, "decode") if s["name"] == names.SPAN_TRANSFER]
    good = [r for r in reads if r[names.TRANSFER_DIRECTION] == "p2p_read" and r[names.TRANSFER_OK]]
    blocks = sum(-(-(n - 1) // 32) for n in prompt_lengths)
    assert sum(r[names.TRANSFER_BYTES] for r in good[: len(PROMPTS)]) == blocks * BYTES_PER_BLOCK
    assert all(r[names.TRANSFER_GBPS] > 0 for r in good)
    handshakes = [s for s in spans_of(pair, "decode") if s["name"] == names.SPAN_HANDSHAKE]
    assert handshakes and handshakes[0]["attributes"][names.TRANSFER_OK]


def test_both_servers_metrics_count_the_pulls_reads_and_loans(pd, happy):
    """vLLM's /metrics, read with prometheus_client's parser: the decode server's pulls and
    NIXL reads of the happy prompts, the prefill server's held blocks and confirmed reads."""
    pair, _ = pd
    _, prompt_lengths, _ = happy
    p2p = "vllm:kvscope_p2p_"
    decode = wait_for(pair.decode.url, p2p + "reads_total", at_least=len(PROMPTS))
    prefill = wait_for(pair.prefill.url, p2p + "reads_notified_total", at_least=len(PROMPTS))
    blocks = sum(-(-(n - 1) // 32) for n in prompt_lengths)
    assert total(decode, p2p + "pulls_total") == len(PROMPTS)
    assert total(decode, p2p + "pull_tokens_total") == sum(n - 1 for n in prompt_lengths)
    assert total(decode, p2p + "read_bytes_total") == blocks * BYTES_PER_BLOCK
    assert total(decode, p2p + "read_duration_seconds_count") == len(PROMPTS)
    assert total(decode, p2p + "kv_wait_seconds_count") == len(PROMPTS)
    assert total(decode, p2p + "failed_pulls_total") == 0
    assert total(decode, p2p + "peers") == 1 and total(decode, p2p + "peers_bypassed") == 0
    assert total(prefill, p2p + "held_total") == len(PROMPTS)
    assert total(prefill, p2p + "leases_expired_total") == 0


def test_prefill_server_freed_the_blocks_once_read(pd, happy):
    pair, _ = pd
    events = [e for s in spans_of(pair, "prefill") for e in s["events"]]
    released = [e for e in events if e["name"] == names.EVENT_LEASE_RELEASED]
    assert [e[names.LEASE_OUTCOME] for e in released][:3] == ["released"] * 3
    wait_until_no_blocks_held([pair.prefill.url, pair.decode.url], timeout_s=20)


def test_streamed_answer_through_the_proxy(pd, tiny_model, expected, happy):
    _, proxy = pd
    body = completion_body(tiny_model, PROMPTS[0], MAX_TOKENS)
    tokens = [t for chunk in streamed_chunks(proxy.url, body) for t in chunk]
    assert tokens == expected[0]


def test_lease_expired_before_the_pull_is_recomputed_not_read(pd, tiny_model, expected):
    pair, _ = pd
    body = completion_body(tiny_model, FAULTS["expired"], MAX_TOKENS)
    params = prefill_only(pair.prefill.url, body)
    time.sleep(max(params["remote_lease_deadline_unix_s"] - time.time(), 0) + 0.5)
    start = time.monotonic()
    tokens = greedy_via(pair.decode.url, {**body, "kv_transfer_params": params})
    assert tokens == expected["expired"]
    assert time.monotonic() - start < 10
    failures = [
        e[names.FAILURE_CAUSE]
        for s in spans_of(pair, "decode")
        for e in s["events"]
        if e["name"] == names.EVENT_LOAD_FAILED
    ]
    assert any(cause.startswith("lease_expired") for cause in failures)
    expired = [
        e
        for s in spans_of(pair, "prefill")
        for e in s["events"]
        if e["name"] == names.EVENT_LEASE_EXPIRED
    ]
    assert expired
    wait_until_no_blocks_held([pair.prefill.url, pair.decode.url], timeout_s=20)


def test_peer_that_never_answers_the_handshake(pd, tiny_model, expected):
    pair, _ = pd
    body = completion_body(tiny_model, FAULTS["silent"], MAX_TOKENS)
    params = prefill_only(pair.prefill.url, body)
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts, never answers
        params["remote_port"] = silent.getsockname()[1]
        start = time.monotonic()
        tokens = greedy_via(pair.decode.url, {**body, "kv_transfer_params": params})
    assert tokens == expected["silent"]
    assert time.monotonic() - start < CONNECTOR["handshake_timeout_s"] + 6
    # Nobody read the prefill server's blocks: its lease frees them.
    wait_until_no_blocks_held([pair.prefill.url, pair.decode.url], timeout_s=LEASE_S + 10)


def test_stopped_prefill_server_ends_in_bounded_time(pd, tiny_model, expected):
    pair, _ = pd
    body = completion_body(tiny_model, FAULTS["stopped"], MAX_TOKENS)
    params = prefill_only(pair.prefill.url, body)
    os.killpg(pair.prefill.process.pid, signal.SIGSTOP)
    try:
        start = time.monotonic()
        tokens = greedy_via(pair.decode.url, {**body, "kv_transfer_params": params})
        elapsed = time.monotonic() - start
    finally:
        os.killpg(pair.prefill.process.pid, signal.SIGCONT)
    # Either UCX read the stopped process's memory directly, or the read timed out: the
    # tokens are right both ways, and the request never waits past the read timeout.
    assert tokens == expected["stopped"]
    assert elapsed < CONNECTOR["read_timeout_s"] + 6
    wait_until_no_blocks_held([pair.prefill.url, pair.decode.url], timeout_s=LEASE_S + 10)


def test_fail_policy_fails_the_request_promptly(pd, tiny_model, fail_decode):
    """A second decode server, with kv_load_failure_policy 'fail', given a silent peer."""
    pair, _ = pd
    server = fail_decode
    try:
        server.wait_ready(400)
        body = completion_body(tiny_model, FAULTS["silent"], MAX_TOKENS)
        params = prefill_only(pair.prefill.url, body)
        with socket.create_server(("127.0.0.1", 0)) as silent:
            params["remote_port"] = silent.getsockname()[1]
            start = time.monotonic()
            answer = httpx.post(
                server.url + "/v1/completions",
                timeout=60,
                json={**body, "kv_transfer_params": params},
            )
        elapsed = time.monotonic() - start
        failed = answer.status_code >= 400 or (
            answer.json()["choices"][0]["finish_reason"] not in ("length", "stop")
        )
        assert failed, answer.text[:300]
        assert elapsed < CONNECTOR["handshake_timeout_s"] + 6
        wait_until_no_blocks_held([server.url], timeout_s=20)
    finally:
        server.stop()


def test_prefill_server_killed_mid_stream(pd, tiny_model, expected):
    """Last in the module: the prefill server does not come back."""
    pair, proxy = pd
    unread = prefill_only(pair.prefill.url, completion_body(tiny_model, FAULTS["killed"], 1))
    body = completion_body(tiny_model, FAULTS["stream"], LONG_TOKENS)
    streamed: list[int] = []
    for chunk in streamed_chunks(proxy.url, body):
        if not streamed:
            os.killpg(pair.prefill.process.pid, signal.SIGKILL)
        streamed += chunk
    assert streamed == expected["stream_long"]  # the decode server had pulled the KV already
    body = completion_body(tiny_model, FAULTS["killed"], MAX_TOKENS)
    start = time.monotonic()
    tokens = greedy_via(pair.decode.url, {**body, "kv_transfer_params": unread})
    assert tokens == expected["killed"]
    assert time.monotonic() - start < CONNECTOR["read_timeout_s"] + 6
    with pytest.raises(Exception, match="502"):
        greedy_via(proxy.url, body, timeout_s=30)
    wait_until_no_blocks_held([pair.decode.url], timeout_s=20)
