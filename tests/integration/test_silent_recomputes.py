"""A real engine whose every host-pool load fails, under vLLM's recompute policy: its users get
the right tokens, and the backend counts each such request as a silent recompute, with the
tokens that failed, in its REST answer and in /metrics."""

import json
import subprocess
import sys
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvscope.harness import configs
from kvscope.harness.engine import BLOCK_SIZE, engine_env
from kvscope.harness.prompts import DISTINCT
from tests.oracle_cache import prompt_set

pytestmark = [pytest.mark.engine, pytest.mark.timeout(600)]

PROMPTS = prompt_set(DISTINCT, max_tokens=16)


@pytest.fixture(scope="module")
def expected(oracle) -> list[list[int]]:
    return oracle.tokens(PROMPTS)  # before the engine under test starts


@pytest.fixture(scope="module")
def engine_run(tiny_model, backend, expected, tmp_path_factory) -> list[list[list[int]]]:
    """Two passes, prefix cache reset between: the first stores every prompt in the host pool,
    the second's loads of them all fail and vLLM recomputes."""
    faults = tmp_path_factory.mktemp("faults") / "faults.json"
    faults.write_text(json.dumps({"fail_load_every": 1}))
    config = configs.offload_config(policy="recompute", faults_path=str(faults))
    env = engine_env(
        KVSCOPE_OTLP_ENDPOINTS=backend.traces_url,
        OTEL_BSP_SCHEDULE_DELAY="100",
        VLLM_ENABLE_V1_MULTIPROCESSING="0",
        OTEL_SERVICE_NAME="kvscope-recompute-engine",
    )
    cmd = [sys.executable, "-m", "kvscope.demo.run_prompts", str(tiny_model), json.dumps(config)]
    cmd += [*PROMPTS.prompts, "--passes", "2", "--max-tokens", str(PROMPTS.max_tokens)]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    passes, telemetry = (json.loads(line) for line in result.stdout.strip().splitlines()[-2:])
    assert telemetry["telemetry"]["dropped_queue_full"] == 0
    _wait_until_stored(backend, 2 * len(PROMPTS.prompts))
    return passes


def _wait_until_stored(backend, requests: int, timeout_s: float = 30.0) -> None:
    """The backend may still be writing the last export when the engine exits."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = backend.get("/api/v1/requests", limit=1000)["items"]
        if len(found) >= requests and all(r["status"] != "running" for r in found):
            return
        time.sleep(0.5)
    raise TimeoutError(f"the backend did not store {requests} ended requests in {timeout_s} s")


def test_users_get_the_oracles_tokens_although_every_load_failed(engine_run, expected):
    assert engine_run == [expected, expected]


def _connector_failures(backend) -> list[dict]:
    """The offload connector's own load-failure reports (vLLM's view names no request)."""
    items = backend.get("/api/v1/failures", kind="load_failed", limit=1000)["items"]
    return [f for f in items if f["request_id"] and f["policy"] == "recompute"]


def test_the_backend_counts_each_recomputed_request_and_the_tokens_that_failed(backend, engine_run):
    failures = _connector_failures(backend)
    failed_requests = {f["request_id"] for f in failures}
    assert len(failed_requests) == len(DISTINCT), "the second pass: every request's load failed"
    failed_tokens = sum(len(json.loads(f["block_ids"])) for f in failures) * BLOCK_SIZE
    assert failed_tokens > 0
    (engine_id,) = {f["engine_id"] for f in failures}

    found = backend.get("/api/v1/stats/recomputes", window_s=3600)
    (row,) = found["rows"]
    assert (row["engine_id"], row["cause"]) == (engine_id, "InjectedFault")
    assert row["requests"] == len(DISTINCT) and not row["truncated"]
    # Each failed load is one failure: its transfer and vLLM's view of its blocks fold into it.
    assert row["load_failures"] == len(failures)
    assert {item["request_id"] for item in row["items"]} == failed_requests
    assert row["recomputed_tokens"] == found["recomputed_tokens"] == failed_tokens
    for item in row["items"]:  # each links to a request that answered normally
        timeline = backend.get(f"/api/v1/requests/{item['id']}/timeline")
        assert timeline["request"]["request_id"] == item["request_id"]
        assert timeline["request"]["status"] in ("finished_length_capped", "finished_stopped")

    scraped = httpx.get(backend.url + "/metrics", timeout=20).text
    samples = {
        (sample.name, sample.labels["engine_id"], sample.labels["cause"]): sample.value
        for family in text_string_to_metric_families(scraped)
        for sample in family.samples
        if family.name.startswith("kvscope_backend_silent_recompute")
    }
    assert samples == {
        ("kvscope_backend_silent_recomputes_total", engine_id, "InjectedFault"): len(DISTINCT),
        ("kvscope_backend_silent_recompute_tokens_total", engine_id, "InjectedFault"): (
            failed_tokens
        ),
    }
