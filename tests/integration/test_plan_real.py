"""What-if sizing on real engines: a prompt workload with shared prefixes through the offload
connector, on a host pool that holds it and on half of it, which evicts. Each pool's replay
reproduces the hit tokens the connector answered (within 2%) and its evictions, and the first
pool's prediction at half its size matches what the second engine then measures (within 5
points of hit rate)."""

import json
import subprocess
import sys
import time

import pytest

from kvscope.harness import configs
from kvscope.harness.engine import engine_env
from kvscope.harness.prompts import SENTENCES

pytestmark = [pytest.mark.engine, pytest.mark.timeout(900)]

BLOCK_BYTES = 16384
"""One block of the tiny model in the host pool: 2 layers x (K, V) x 2 heads x 32 x 32 x bf16."""
POOL_BLOCKS = 48
"""Today's pool: it holds the workload; half of it must evict."""
# Three families, each a shared six-sentence prefix (three whole blocks); each pass asks every
# family once with an ending of its own, one request after another (a user at a time: the
# schedule, which a hit changes when requests run together, is then the same at any pool
# size). A pass's prompts share no block with each other (so vLLM's own prefix cache, emptied
# between passes, never answers for the pool), and each shares its family's prefix with every
# earlier pass.
PASSES = [
    [
        " ".join(SENTENCES[(family + j) % 5] for j in range(6))
        + f" Family {family} pass {number}: "
        + " ".join(SENTENCES[(family + number + j) % 5] for j in range(2))
        for family in range(3)
    ]
    for number in range(4)
]


# The passes, vLLM's prefix cache emptied between them, retried until it is: a reset that fails
# (the connector still holds blocks for stores) leaves local hits that differ from run to run,
# and then the two pools would not be asked the same blocks.
RUNNER = """
import json, sys
from kvscope.harness.engine import in_process_llm
from kvscope.harness.oracle import greedy_tokens
from kvscope.traces.sdk.configure import flush
model, config = sys.argv[1], json.loads(sys.argv[2])
with in_process_llm(model, config) as llm:
    for prompts in json.loads(sys.argv[3]):
        for prompt in prompts:
            greedy_tokens(llm, [prompt], 4)
        for _ in range(50):
            if llm.reset_prefix_cache():
                break
            llm.llm_engine.step()
        else:
            raise SystemExit("vLLM's prefix cache would not reset")
flush(timeout_s=5)
"""


def _run_engine(tiny_model, backend, pool_blocks: int) -> None:
    config = configs.offload_config(cpu_bytes_to_use=pool_blocks * BLOCK_BYTES)
    env = engine_env(
        KVSCOPE_OTLP_ENDPOINTS=backend.traces_url,
        OTEL_BSP_SCHEDULE_DELAY="100",
        VLLM_ENABLE_V1_MULTIPROCESSING="0",
        OTEL_SERVICE_NAME=f"kvscope-plan-{pool_blocks}",
    )
    cmd = [sys.executable, "-c", RUNNER, str(tiny_model), json.dumps(config), json.dumps(PASSES)]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]


def _engine_of(backend, pool_blocks: int, timeout_s: float = 30.0) -> dict:
    """The plan's engine whose pool has pool_blocks blocks, once its lookups stopped arriving."""
    deadline, last = time.monotonic() + timeout_s, None
    while time.monotonic() < deadline:
        report = backend.get("/api/v1/plan", window=3600, sizes="0.5,1,2")
        found = [e for e in report["engines"] if e["pool_blocks"] == pool_blocks]
        if found and found[0]["lookups"] == last:
            return found[0]
        last = found[0]["lookups"] if found else None
        time.sleep(1.0)
    raise TimeoutError(f"no settled plan for a pool of {pool_blocks} blocks: {report}")


@pytest.fixture(scope="module")
def plans(tiny_model, backend) -> tuple[dict, dict]:
    _run_engine(tiny_model, backend, POOL_BLOCKS)
    today = _engine_of(backend, POOL_BLOCKS)
    _run_engine(tiny_model, backend, POOL_BLOCKS // 2)
    return today, _engine_of(backend, POOL_BLOCKS // 2)


def _row(engine: dict, policy: str, factor: float) -> dict:
    return next(r for r in engine["rows"] if r["policy"] == policy and r["factor"] == factor)


def test_the_workload_evicts_and_hits_at_half_the_pool(plans):
    _, half = plans
    assert half["recorded_evicted_blocks"] > 0 and half["measured_hit_tokens"] > 0


def test_replay_of_each_pool_reproduces_its_measured_hits_and_evictions(plans):
    for engine in plans:
        replayed = _row(engine, "lru", 1.0)
        measured = engine["measured_hit_tokens"]
        print(
            f"pool {engine['pool_blocks']}: measured {measured} hit tokens, replayed "
            f"{replayed['hit_tokens']}; evicted {engine['recorded_evicted_blocks']} blocks, "
            f"replayed {replayed['evicted_blocks']}"
        )
        assert abs(replayed["hit_tokens"] - measured) <= 0.02 * measured
        assert replayed["evicted_blocks"] == engine["recorded_evicted_blocks"]


def test_half_the_pool_measures_the_hit_rate_predicted(plans):
    today, half = plans
    predicted = _row(today, "lru", 0.5)["pool_hit_rate"]
    measured = half["measured_hit_tokens"] / half["asked_tokens"]
    print(f"half the pool: predicted hit rate {predicted:.3f}, measured {measured:.3f}")
    assert abs(predicted - measured) <= 0.05
    # The half pool's own replay at its size agrees with it too; a larger pool hits more.
    assert _row(today, "lru", 2.0)["hit_tokens"] >= _row(today, "lru", 1.0)["hit_tokens"]


def test_time_saved_is_priced_with_measured_rates(plans):
    today, _ = plans
    assert today["load_tokens_per_s"] > 0 and today["prefill_tokens_per_s"] > 0
    row = _row(today, "lru", 1.0)
    assert row["seconds_saved"] is not None and row["prefill_tokens_saved"] == row["hit_tokens"]
