"""vLLM's own OTLP exporter (--otlp-traces-endpoint) pointed at the backend's gRPC receiver, with
the token in OTEL_EXPORTER_OTLP_TRACES_HEADERS: its llm_request spans land in the timelines."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvscope.harness.engine import engine_env, free_port

pytestmark = [pytest.mark.engine, pytest.mark.timeout(400)]
ROOT = Path(__file__).resolve().parents[3]
TOKEN = "vllm-grpc-token"
TTFT = "gen_ai.latency.time_to_first_token"


def _run_engine(model: Path, grpc_port: int, storage: Path) -> list[str]:
    env = engine_env(
        OTEL_EXPORTER_OTLP_TRACES_PROTOCOL="grpc",
        OTEL_EXPORTER_OTLP_TRACES_HEADERS=f"authorization=Bearer%20{TOKEN}",
        OTEL_BSP_SCHEDULE_DELAY="100",
        OTEL_SERVICE_NAME="vllm-grpc-test",
    )
    env.pop("KVSCOPE_OTLP_ENDPOINTS", None)  # vLLM's exporter alone carries every span
    endpoint = f"http://127.0.0.1:{grpc_port}"
    cmd = [
        sys.executable,
        "-m",
        "tests.backend.ingest.vllm_traced_run",
        str(model),
        endpoint,
        str(storage),
    ]
    result = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def _timelines(client, count: int, deadline_s: float = 20) -> list[dict]:
    """Each stored request's timeline, once every request has its llm_request data."""
    deadline = time.monotonic() + deadline_s
    while True:
        requests = client.get("/api/v1/requests", params={"limit": 50}).json()["items"]
        timelines = [client.get(f"/api/v1/requests/{r['id']}/timeline").json() for r in requests]
        done = [t for t in timelines if t["ttft"]["sources"].get("ttft_ms") == TTFT]
        if len(done) >= count or time.monotonic() > deadline:
            return timelines
        time.sleep(0.3)


def test_vllm_llm_request_spans_over_grpc_land_in_the_request_timeline(
    make_backend, tiny_model, tmp_path
):
    if os.environ.get("KVSCOPE_OTLP_ENDPOINTS"):
        pytest.skip("KVSCOPE_OTLP_ENDPOINTS is set: the engine would export elsewhere too")
    backend = make_backend(grpc=True, grpc_port=free_port(), token=TOKEN)
    request_ids = _run_engine(tiny_model, backend.settings.grpc_port, tmp_path / "kv")
    with backend.client() as client:
        timelines = _timelines(client, len(request_ids))
        assert len(timelines) == len(request_ids), "one kvscope.request per prompt"
        for timeline in timelines:
            # Read from the llm_request span of the same request (vLLM's own trace).
            sources = timeline["ttft"]["sources"]
            assert sources.get("ttft_ms") == TTFT, timeline["ttft"]
            assert sources.get("queue_ms") == "gen_ai.latency.time_in_queue"
            assert timeline["ttft"]["ttft_ms"] > 0
            assert {"lookup_start", "finished"} <= {p["point"] for p in timeline["points"]}
