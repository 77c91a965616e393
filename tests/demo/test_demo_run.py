"""`kvscope demo` for a short run on the CPU: requests complete, both connectors hit, injected
failures are recorded with their outcomes, and every process is gone at the end."""

import json
import os
import subprocess
import sys
import time
import urllib.request

import pytest

pytestmark = [pytest.mark.engine, pytest.mark.slow]


def get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


@pytest.fixture(scope="module")
def demo_run(tiny_model, tmp_path_factory):
    """A 75 s demo with faults; the backend database stays in the workdir afterwards."""
    workdir = tmp_path_factory.mktemp("demo")
    cmd = [sys.executable, "-m", "kvscope.cli.main", "demo", "--model", str(tiny_model),
           "--duration", "75", "--rate", "3", "--workdir", str(workdir), "--backend-port",
           "14318", "--dashboard-port", "18501", "--proxy-port", "18000"]  # fmt: skip
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    return result, workdir


def test_the_demo_ends_cleanly(demo_run):
    result, workdir = demo_run
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "every demo process has exited" in result.stdout
    assert "workload done:" in result.stdout and " 0 ok" not in result.stdout


def test_no_demo_process_survives(demo_run):
    _, workdir = demo_run
    survivors = subprocess.run(["pgrep", "-f", str(workdir)], capture_output=True, text=True)
    assert survivors.stdout.strip() == "", "processes still running: " + survivors.stdout


@pytest.fixture(scope="module")
def backend(demo_run):
    """The demo's database, served again after the run."""
    _, workdir = demo_run
    env = {**os.environ, "DATABASE_URL": f"sqlite:///{workdir / 'kvscope.db'}"}
    cmd = [sys.executable, "-m", "kvscope.cli.main", "backend", "--port", "14319"]
    process = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    url = "http://127.0.0.1:14319"
    try:
        for _ in range(100):
            try:
                get(url + "/health")
                break
            except OSError:
                time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        process.wait(20)


def test_requests_completed_and_both_connectors_hit(backend):
    requests = get(backend + "/api/v1/requests?limit=500")["items"]
    assert sum(r["status"].startswith("finished") for r in requests) >= 20
    hits = get(backend + "/api/v1/stats/hits?window_s=100000")
    children = {h["child"] for h in hits if h["hit_requests"] > 0}
    assert {"p2p", "offload"} <= children, hits


def test_injected_failures_are_recorded_with_outcomes(backend):
    failures = get(backend + "/api/v1/failures?limit=500")["items"]
    causes = {f["cause"] or "" for f in failures}
    assert any(c.startswith("InjectedFault") for c in causes), causes
    assert any(c == "timeout" for c in causes), causes
    assert any(f["policy"] == "recompute" or f["outcome"] for f in failures)
