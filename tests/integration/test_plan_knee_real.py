"""The plan's ceiling and knee on a real engine, for a workload whose truth is known by
construction: FAMILIES distinct prefixes of PREFIX_BLOCKS whole blocks, each asked once a pass
in the same cyclic order, one request at a time, over PASSES passes. A pool that never evicts
hits every repeat; under LRU a cyclic order hits nothing one block short of the working set
(FAMILIES x PREFIX_BLOCKS blocks; one request at a time, its lease pins nothing a store needs)
and everything at it. The plan must name that knee within one size step, price each request's
TTFT (vLLM's own llm_request spans) and predict slower first tokens below it."""

import json
import subprocess
import sys
import time

import pytest

from kvscope.harness import configs
from kvscope.harness.backend_process import BackendProcess
from kvscope.harness.engine import engine_env

pytestmark = [pytest.mark.engine, pytest.mark.timeout(600)]

BLOCK_SIZE = 32
BLOCK_BYTES = 16384
"""One block of the tiny model in the host pool: 2 layers x (K, V) x 2 heads x 32 x 32 x bf16."""
FAMILIES, PREFIX_BLOCKS, PASSES = 4, 3, 3
WORKING_SET = FAMILIES * PREFIX_BLOCKS
POOL_BLOCKS = 2 * WORKING_SET
"""Today's pool holds the workload twice over: no eviction, every repeat hit."""
# A family's prefix: whole blocks of token ids of its own; each request ends in two ids of its
# own (below a block: never stored), and with two generated tokens stays within its last block.
PASSES_OF_PROMPTS = [
    [
        [20 + (97 * family + 13 * i) % 1900 for i in range(PREFIX_BLOCKS * BLOCK_SIZE)]
        + [1930 + 4 * number + family, 1990 + number]
        for family in range(FAMILIES)
    ]
    for number in range(PASSES)
]

# Each request alone; vLLM's prefix cache emptied between passes (retried until it is), so
# every lookup asks the connector for the whole prefix.
RUNNER = """
import json, sys
from kvscope.harness.engine import in_process_llm
from kvscope.harness.oracle import greedy_params
from kvscope.traces.sdk.configure import flush
model, config, endpoint = sys.argv[1], json.loads(sys.argv[2]), sys.argv[4]
with in_process_llm(model, config, otlp_traces_endpoint=endpoint) as llm:
    for prompts in json.loads(sys.argv[3]):
        for token_ids in prompts:
            llm.generate([{"prompt_token_ids": token_ids}], greedy_params(2), use_tqdm=False)
        for _ in range(50):
            if llm.reset_prefix_cache():
                break
            llm.llm_engine.step()
        else:
            raise SystemExit("vLLM's prefix cache would not reset")
    assert flush(timeout_s=10), "spans not flushed"
"""


@pytest.fixture(scope="module")
def engine(tiny_model, backend) -> dict:
    """The plan of one engine run, once its lookups and TTFTs stopped arriving."""
    config = configs.offload_config(cpu_bytes_to_use=POOL_BLOCKS * BLOCK_BYTES)
    # vLLM's exporter carries every span, its llm_request ones and ours (kvscope joins it).
    env = engine_env(
        OTEL_EXPORTER_OTLP_TRACES_PROTOCOL="http/protobuf",
        OTEL_BSP_SCHEDULE_DELAY="100",
        VLLM_ENABLE_V1_MULTIPROCESSING="0",
        OTEL_SERVICE_NAME="kvscope-plan-knee",
    )
    env.pop("KVSCOPE_OTLP_ENDPOINTS", None)
    prompts = json.dumps(PASSES_OF_PROMPTS)
    cmd = [sys.executable, "-c", RUNNER, str(tiny_model), json.dumps(config), prompts]
    result = subprocess.run(
        [*cmd, backend.traces_url], env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return _settled(backend)


def _settled(backend: BackendProcess, timeout_s: float = 30.0) -> dict:
    deadline, last, report = time.monotonic() + timeout_s, None, None
    while time.monotonic() < deadline:
        report = backend.get("/api/v1/plan", window=3600)
        found = [e for e in report["engines"] if e["pool_blocks"] == POOL_BLOCKS]
        now = found and (found[0]["lookups"], found[0]["priced_requests"])
        if now and now == last and now[0] >= FAMILIES * PASSES:
            return found[0]
        last = now
        time.sleep(1.0)
    raise TimeoutError(f"no settled plan for a pool of {POOL_BLOCKS} blocks: {report}")


def test_the_ceiling_is_every_repeat_hit(engine):
    repeats = (PASSES - 1) * FAMILIES * PREFIX_BLOCKS * BLOCK_SIZE
    assert engine["measured_hit_tokens"] == repeats  # today's pool holds the workload
    ceiling = engine["ceiling"]
    assert ceiling["hit_tokens"] == repeats and ceiling["pool_blocks"] == WORKING_SET
    # One request at a time: no lookup meets a store in flight, in the pool or its replay.
    assert ceiling["in_flight_lookups"] == engine["recorded_in_flight_lookups"] == 0


def test_the_lru_knee_is_the_working_set_within_one_size_step(engine):
    knee = next(k for k in engine["knees"] if k["policy"] == "lru")
    print(
        f"LRU knee {knee['pool_blocks']} blocks (truth {WORKING_SET}), step "
        f"{engine['size_step_blocks']}; rates {engine['load_tokens_per_s']:.0f} load, "
        f"{engine['prefill_tokens_per_s']:.0f} prefill tokens/s"
    )
    assert abs(knee["pool_blocks"] - WORKING_SET) <= engine["size_step_blocks"] == 1
    for knee in engine["knees"]:  # scan-resistant ones may get there sooner, never later
        assert knee["pool_blocks"] <= WORKING_SET
        assert knee["hit_tokens"] >= 0.99 * engine["ceiling"]["hit_tokens"]


def test_ttft_is_predicted_from_each_requests_measured_ttft(engine):
    assert engine["priced_requests"] == FAMILIES * PASSES
    assert engine["measured_ttft_ms_p50"] > 0
    rows = {(r["policy"], r["factor"]): r for r in engine["rows"]}
    below, today = rows[("lru", 0.25)], rows[("lru", 1.0)]
    print(
        f"TTFT p50 today {engine['measured_ttft_ms_p50']:.2f} ms, predicted at 1x "
        f"{today['predicted_ttft_ms_p50']:.2f}, at 0.25x {below['predicted_ttft_ms_p50']:.2f}"
    )
    assert below["hit_tokens"] == 0 and today["hit_tokens"] == engine["measured_hit_tokens"]
    # Today's replay hits what each request hit: its prediction is what was measured.
    assert today["predicted_ttft_ms_p50"] == pytest.approx(engine["measured_ttft_ms_p50"])
    if today["seconds_saved"] > 0:  # a load is cheaper than the prefill it spares
        assert below["predicted_ttft_ms_p50"] > today["predicted_ttft_ms_p50"]
