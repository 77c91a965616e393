"""A real traced engine exports over OTLP/HTTP to a running backend, which rebuilds its state."""

import json
import os
import subprocess
import sys
import time

import httpx
import pytest

from kvscope.harness.engine import engine_env, free_port
from kvscope.harness.prompts import DISTINCT

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def backend_url(tmp_path_factory):
    """`kvscope backend` in a subprocess on 127.0.0.1 with a fresh SQLite file."""
    port = free_port()
    workdir = tmp_path_factory.mktemp("backend")
    env = {**os.environ, "DATABASE_URL": f"sqlite:///{workdir / 'kvscope.db'}"}
    cmd = [sys.executable, "-m", "kvscope.cli.main", "backend", "--port", str(port)]
    with open(workdir / "backend.log", "wb") as log:
        process = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.3)
        else:
            raise TimeoutError((workdir / "backend.log").read_text()[-2000:])
        yield url
    finally:
        process.terminate()
        process.wait(20)


@pytest.fixture(scope="module")
def engine_run(tiny_model, backend_url, tmp_path_factory):
    """Two passes with the CPU offload connector (store, then load; one load fails)."""
    config = {
        "kv_connector": "CpuOffloadConnector",
        "kv_connector_module_path": "kvscope.connector.cpu_offload.connector",
        "kv_role": "kv_both",
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {
            "cpu_bytes_to_use": 8 << 20,
            "faults": {"fail_load_every": 3},
        },
    }
    env = engine_env(
        KVSCOPE_OTLP_ENDPOINTS=f"{backend_url}/v1/traces",
        OTEL_BSP_SCHEDULE_DELAY="100",
        VLLM_ENABLE_V1_MULTIPROCESSING="0",
        OTEL_SERVICE_NAME="kvscope-test-engine",
    )
    cmd = [
        sys.executable,
        "-m",
        "kvscope.demo.run_prompts",
        str(tiny_model),
        json.dumps(config),
        *DISTINCT,
        "--passes",
        "2",
        "--dump-offload-state",
    ]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [json.loads(line) for line in result.stdout.strip().splitlines()[-3:]]
    return lines[1]["telemetry"], lines[2]["offload_state"]


def get(url: str, path: str, **params) -> dict:
    response = httpx.get(url + path, params=params, timeout=10)
    response.raise_for_status()
    return response.json()


def test_every_exported_span_is_stored(backend_url, engine_run):
    telemetry, _ = engine_run
    assert telemetry["exported"] > 0
    assert telemetry["dropped_queue_full"] == telemetry["dropped_export_failed"] == 0
    (stream,) = get(backend_url, "/api/v1/streams")  # one in-process engine: one stream
    assert stream["holes"] == [] and stream["telemetry_dropped"] == 0
    assert stream["received"] == stream["highest_seq"] + 1 == stream["telemetry_emitted"]


def test_request_timelines_are_computed(backend_url, engine_run):
    requests = get(backend_url, "/api/v1/requests", limit=50)["items"]
    assert len(requests) == 2 * len(DISTINCT)
    loaded = 0
    for request in requests:
        timeline = get(backend_url, f"/api/v1/requests/{request['id']}/timeline")
        points = {point["point"] for point in timeline["points"]}
        assert {"lookup_start", "lookup_result", "finished"} <= points, points
        loaded += "transfer_complete" in points
    assert loaded == len(DISTINCT), "second pass: every request loaded from the host pool"


def test_rebuilt_block_and_lease_state_equals_the_connectors_own(backend_url, engine_run):
    _, state = engine_run
    blocks = get(backend_url, "/api/v1/blocks", tier="host", limit=1000)["items"]
    rebuilt = {b["block_id"]: b["block_hash"] for b in blocks if b["state"] == "stored"}
    assert rebuilt == {int(k): v for k, v in state["stored"].items()}
    active = get(backend_url, "/api/v1/leases", limit=1000)["items"]
    assert [lease for lease in active if lease.get("outcome") is None] == []
    assert state["leases"] == []


def test_injected_failure_is_recorded_with_cause_and_policy(backend_url, engine_run):
    failures = get(backend_url, "/api/v1/failures", limit=100)["items"]
    causes = {f["cause"] for f in failures}
    assert any(cause and cause.startswith("InjectedFault") for cause in causes), causes
    assert any(f["policy"] == "recompute" for f in failures)
