"""A workload that plants each miss reason on one in-process engine with the offload connector
(run as a script by test_misses_real.py): first sight, a prefix that diverges, another cache
salt, a failed load, evictions, and a lease that expires while its request waits for room."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from kvscope.harness.engine import in_process_llm  # noqa: E402
from kvscope.traces.sdk.configure import flush  # noqa: E402
from kvscope.verify.driver import add_requests, run, settle  # noqa: E402
from tests.reliability.engine_ops import offload_scheduler, set_faults  # noqa: E402
from tests.stepping import step_until, step_until_prefix_cache_reset  # noqa: E402

TAIL = [7, 8, 9, 10, 11]
"""Five tokens past the last whole block: below a whole block."""


def blocks(llm, seed: int, count: int) -> list[int]:
    size = llm.llm_engine.vllm_config.cache_config.block_size
    return [100 + seed * 997 + i for i in range(count * size)]


def alone(llm, req_id: str, prompt, max_tokens: int = 2) -> None:
    """One request, its stores settled, then vLLM's prefix cache emptied: only the host pool
    can serve what it stored."""
    run(llm, [req_id], [prompt], max_tokens)
    settle(llm)
    step_until_prefix_cache_reset(llm)


def lease_expires_while_waiting(llm, faults: Path, shared: list[int]) -> None:
    """g's lookup hits `shared` and leases it for 1 us; g cannot get KV blocks while h runs
    and g0 (scheduled before it) prefills, and g0's stores fill the pool in that very step,
    evicting the unpinned blocks g's lease held. Asked again, g misses them."""
    offload = offload_scheduler(llm)
    expired_before = offload.hit_leases.expiries
    add_requests(llm, ["miss-h"], [blocks(llm, 40, 6)], 280)
    for _ in range(3):
        llm.llm_engine.step()  # h prefilled and decoding: it holds its blocks
    set_faults(faults, {"lease_timeout_ms": 0.001})
    add_requests(llm, ["miss-g0"], [blocks(llm, 50, 12) + TAIL], 2)
    add_requests(llm, ["miss-g"], [shared + blocks(llm, 60, 6) + TAIL], 2)
    step_until(llm, lambda: not llm.llm_engine.has_unfinished_requests(), 300)
    set_faults(faults, {})
    expired = offload.hit_leases.expiries - expired_before
    assert expired >= 1, "g's lease never expired before its load"
    settle(llm)


def never_read(llm) -> None:
    """Twelve prompts that share nothing: the pool stores 48 blocks and serves none."""
    for seed in range(70, 82):
        alone(llm, f"unread-{seed}", blocks(llm, seed, 4) + TAIL)


def main(model: str, config: dict, faults: Path, mode: str) -> None:
    with in_process_llm(Path(model), config, num_gpu_blocks_override=24, max_model_len=512) as llm:
        if mode == "never_read":
            never_read(llm)
            flush(timeout_s=10)
            return
        a = blocks(llm, 1, 4) + TAIL
        alone(llm, "miss-a", a)  # first sight: 4 blocks stored
        alone(llm, "miss-b", blocks(llm, 1, 2) + blocks(llm, 2, 2) + TAIL)  # diverged at 2
        alone(llm, "miss-c", {"prompt_token_ids": a, "cache_salt": "tenant-2"})  # other key
        set_faults(faults, {"fail_load_req_prefix": "miss-d"})
        alone(llm, "miss-d", a)  # hit, load failed, recomputed
        set_faults(faults, {})
        for seed in (3, 4, 5):  # 12 new blocks: the pool of pool_blocks evicts a's
            alone(llm, f"miss-e{seed}", blocks(llm, seed, 4) + TAIL)
        alone(llm, "miss-f", a)  # evicted
        shared = blocks(llm, 30, 2)
        alone(llm, "miss-g-store", shared + TAIL)
        lease_expires_while_waiting(llm, faults, shared)
    flush(timeout_s=10)


if __name__ == "__main__":
    main(sys.argv[1], json.loads(sys.argv[2]), Path(sys.argv[3]), sys.argv[4])
