"""kvscope's per-source token counts against vLLM's own counters on one `vllm serve` with the
offload connector, exporting to a backend: a miss, a prefix-cache hit, a host-pool hit.

Where they agree, and why: kvscope counts each request at its first decided lookup, and vLLM's
prompt_tokens_by_source counts each request's PrefillStats, set at its first scheduling from
the same local and external hits: the two must be equal per source, as must the prompt tokens.
Where they differ: vllm:prefix_cache_queries/hits and external_prefix_cache_queries/hits count
per scheduling attempt (a request the budget or a pending load sends back to the queue is
queried again, and a preempted one again from zero), and the external queries are the tokens
past the local hit, not the prompt; vLLM's own hit rate from them can double-count (vllm#30522)
where kvscope's, one lookup per request, cannot. With one request at a time, as here, the hits
of both equal kvscope's and only the queries' basis differs."""

import time

import httpx
import pytest

from kvscope.harness.engine import ServerProcess, engine_env, free_port, serve_command
from kvscope.harness.prompts import long_prompt
from tests.connector.cpu_offload.test_offload_serve_metrics import OFFLOAD
from tests.connector.prom_scrape import scrape_server, total, wait_for

pytestmark = [pytest.mark.engine, pytest.mark.slow, pytest.mark.timeout(500)]
PROMPT = long_prompt(3, sentences=6)
STEP = "one more step"


@pytest.fixture(scope="module")
def server(tiny_model, backend, tmp_path_factory):
    env = engine_env(
        VLLM_SERVER_DEV_MODE="1",
        KVSCOPE_OTLP_ENDPOINTS=backend.traces_url,
        OTEL_BSP_SCHEDULE_DELAY="100",
        OTEL_SERVICE_NAME="kvscope-accounting-serve",
    )
    port = free_port()
    log = tmp_path_factory.mktemp("accounting-serve") / "vllm.log"
    process = ServerProcess(serve_command(tiny_model, port, OFFLOAD), port, env, log)
    try:
        process.wait_ready(300)
        yield process
    finally:
        process.stop()


def complete(url: str, model, prompt: str, max_tokens: int = 4) -> None:
    body = {"model": str(model), "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    httpx.post(url + "/v1/completions", json=body, timeout=60).raise_for_status()


@pytest.fixture(scope="module")
def counted(server, backend, tiny_model):
    """(vLLM's samples, the backend's accounting) once every request is stored."""
    url = server.url
    complete(url, tiny_model, PROMPT)  # a miss: computed, stored to the host pool
    complete(url, tiny_model, PROMPT)  # vLLM's prefix cache
    wait_for(url, "vllm:kvscope_offload_stored_blocks_total")
    complete(url, tiny_model, STEP, 1)  # one more step: the stores' last reports arrive
    httpx.post(url + "/reset_prefix_cache", timeout=30).raise_for_status()
    complete(url, tiny_model, PROMPT)  # the host pool
    requests = 4
    wait_for(url, "vllm:request_success_total", at_least=requests)
    deadline = time.monotonic() + 60
    while True:
        account = backend.get("/api/v1/stats/accounting", window_s=3600)
        if sum(e["requests"] for e in account["engines"]) >= requests:
            return scrape_server(url), account
        assert time.monotonic() < deadline, f"the backend accounted {account} of {requests}"
        time.sleep(0.5)


def test_every_request_adds_up(counted):
    _, account = counted
    assert account["violations"] == [] and account["violations_total"] == 0
    (engine,) = account["engines"]
    assert engine["requests"] == 4
    assert engine["external_hit_tokens"].get("host", 0) > 0  # the third pass loaded
    assert engine["local_hit_tokens"] > 0  # the second pass hit vLLM's prefix cache
    hits = engine["local_hit_tokens"] + sum(engine["external_hit_tokens"].values())
    assert hits + engine["computed_tokens"] == engine["prompt_tokens"]
    assert engine["hit_rate"] == pytest.approx(hits / engine["prompt_tokens"])


def test_kvscope_and_vllm_count_the_same_tokens_per_source(counted):
    vllm, account = counted
    (engine,) = account["engines"]
    by_source = "vllm:prompt_tokens_by_source_total"
    assert total(vllm, "vllm:prompt_tokens_total") == engine["prompt_tokens"]
    assert total(vllm, by_source, source="local_cache_hit") == engine["local_hit_tokens"]
    external = sum(engine["external_hit_tokens"].values())
    assert total(vllm, by_source, source="external_kv_transfer") == external
    assert total(vllm, by_source, source="local_compute") == engine["computed_tokens"]
    # Per scheduling attempt, not per request: equal hits here (one request at a time)...
    assert total(vllm, "vllm:prefix_cache_hits_total") == engine["local_hit_tokens"]
    assert total(vllm, "vllm:external_prefix_cache_hits_total") == external
    # ... while vLLM's external queries are the tokens past the local hit, never the prompt.
    queries = total(vllm, "vllm:external_prefix_cache_queries_total")
    assert queries == engine["prompt_tokens"] - engine["local_hit_tokens"]
