"""Miss reasons on real engines: a workload that plants first sight, a diverging prefix,
another cache salt, a failed load, evictions and an expired lease (miss_workload.py) through
the offload connector, exporting to a backend process. Each request's reasons add up to its
missed tokens and each planted cause shows under its name; a second engine whose pool is
written and never read raises that alarm, and the first, which serves hits, does not."""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvscope.harness import configs
from kvscope.harness.engine import engine_env

pytestmark = [pytest.mark.engine, pytest.mark.timeout(900)]

WORKLOAD = Path(__file__).parent / "miss_workload.py"
BLOCK_BYTES = 16384
"""One block of the tiny model in the host pool (tests/integration/test_plan_real.py)."""
POOL_BLOCKS = 12


def _run(tiny_model, backend, tmp_path, mode: str, pool_blocks: int) -> None:
    faults = tmp_path / f"faults-{mode}.json"
    faults.write_text("{}")
    config = configs.offload_config(
        cpu_bytes_to_use=pool_blocks * BLOCK_BYTES, faults_path=str(faults)
    )
    env = engine_env(
        KVSCOPE_OTLP_ENDPOINTS=backend.traces_url,
        OTEL_BSP_SCHEDULE_DELAY="100",
        VLLM_ENABLE_V1_MULTIPROCESSING="0",
        OTEL_SERVICE_NAME=f"kvscope-misses-{mode}",
    )
    cmd = [sys.executable, str(WORKLOAD), str(tiny_model), json.dumps(config), str(faults), mode]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]


def _settled(backend, prefix: str, count: int, timeout_s: float = 60.0) -> list[dict]:
    """The explained requests whose id starts with prefix, once all count have arrived."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = backend.get("/api/v1/stats/misses", window_s=3600)
        mine = [r for r in found["requests"] if r["request_id"].startswith(prefix)]
        if len(mine) >= count:
            return mine
        assert time.monotonic() < deadline, f"{len(mine)} of {count} {prefix} requests explained"
        time.sleep(1.0)


@pytest.fixture(scope="module")
def explained(tiny_model, backend, tmp_path_factory):
    _run(tiny_model, backend, tmp_path_factory.mktemp("planted"), "planted", POOL_BLOCKS)
    # a b c d e3 e4 e5 f g-store h g0 g: 12 requests
    found = _settled(backend, "miss-", 12)
    return {r["request_id"].split("-", 1)[1].rsplit("-", 1)[0]: r for r in found}, found


def _tokens(request: dict, reason: str) -> int:
    return sum(r["tokens"] for r in request["reasons"] if r["reason"] == reason)


def test_every_requests_reasons_add_up_to_its_missed_tokens(explained):
    _, found = explained
    for request in found:
        assert request["violation"] is None, request
        assert sum(r["tokens"] for r in request["reasons"]) == request["missed_tokens"]
        assert _tokens(request, "partial_block") > 0  # every prompt ends in a partial block


def test_each_planted_cause_shows_under_its_name(explained):
    by_id, _ = explained
    print({k: [(r["reason"], r["tokens"]) for r in v["reasons"]] for k, v in by_id.items()})
    a, b, c, d, f, g = (by_id[k] for k in ("a", "b", "c", "d", "f", "g"))
    size = _tokens(a, "first_sight") // 4
    assert size > 0 and a["served_tokens"] == 0
    assert b["served_tokens"] == 2 * size and _tokens(b, "prefix_diverged") == 2 * size
    assert any(r.get("diverged_at_block") == 2 for r in b["reasons"])
    assert _tokens(c, "other_key") == 4 * size  # a's tokens under another cache salt
    assert _tokens(d, "load_failed") == 4 * size and d["served_tokens"] == 0
    evicted = [r for r in f["reasons"] if r["reason"] == "evicted"]
    assert sum(r["tokens"] for r in evicted) == 4 * size
    assert all(r["evicted_before_lookup_s"] > 0 for r in evicted)
    assert _tokens(g, "lease_expired") >= size


def test_a_pool_written_and_never_read_raises_its_alarm_and_a_serving_one_does_not(
    explained, tiny_model, backend, tmp_path_factory
):
    _run(tiny_model, backend, tmp_path_factory.mktemp("unread"), "never_read", 64)
    _settled(backend, "unread-", 12)
    alarms = backend.get("/api/v1/stats/tier-alarms", window_s=3600)["tiers"]
    assert len(alarms) == 2
    cold = next(t for t in alarms if t["hit_blocks"] == 0)
    warm = next(t for t in alarms if t["hit_blocks"] > 0)
    assert cold["stored_blocks"] >= 48 and cold["written_never_read"]
    assert "written, never read" in cold["alarms"][0]
    assert not warm["written_never_read"] and warm["evicted_blocks"] > 0
    assert warm["alarms"] == []
