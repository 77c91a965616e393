"""vLLM's real Scheduler over two KV cache groups (full + sliding window) with the offload
connector's scheduler half, and its worker half over KV tensors laid out as vLLM overlays groups.

The CPU platform turns the hybrid KV cache manager off in a real engine, so these tests drive
the engine's parts directly (harness.stepped), as vLLM's own scheduler tests do, with a CPU
device config. The "forward" writes a value into each block it computes that names the block's
group, index and layer, so a loaded block says whether the right group's KV landed in it.
"""

import time
from pathlib import Path
from typing import Any

import torch
from vllm.config import KVTransferConfig, VllmConfig
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, SlidingWindowSpec
from vllm.v1.request import Request

from kvscope.harness import configs, stepped
from kvscope.harness.stepped import ComputedBlock, SteppedEngine

BLOCK = 32
WINDOW = 64  # tokens: a hit needs cdiv(63, 32) = 2 window blocks of the sliding-window group
NUM_BLOCKS = 96
NUM_LAYERS = 2
HEADS, HEAD_DIM = 2, 32
GROUPS = ("full", "swa")
HASHER = stepped.block_hasher(BLOCK)


def kv_cache_config(groups: tuple[str, ...] = GROUPS) -> KVCacheConfig:
    specs = {
        "full": FullAttentionSpec(
            BLOCK, num_kv_heads=HEADS, head_size=HEAD_DIM, dtype=torch.bfloat16
        ),
        "swa": SlidingWindowSpec(
            BLOCK,
            num_kv_heads=HEADS,
            head_size=HEAD_DIM,
            dtype=torch.bfloat16,
            sliding_window=WINDOW,
        ),
    }
    return stepped.stepped_kv_cache_config(NUM_BLOCKS, {g: specs[g] for g in groups}, NUM_LAYERS)


def vllm_config(
    model: Path, extra: dict[str, Any] | None = None, policy: str = "recompute"
) -> VllmConfig:
    offload = configs.offload_config(policy, **{"cpu_bytes_to_use": 2 << 20, **(extra or {})})
    return stepped.stepped_vllm_config(
        model, KVTransferConfig(**offload), NUM_BLOCKS, BLOCK, hybrid=True
    )


def request(req_id: str, prompt: list[int], max_tokens: int = 2) -> Request:
    return stepped.stepped_request(req_id, prompt, max_tokens, BLOCK)


def block_value(group: int, index: int, layer: int) -> float:
    """What the fake forward writes into block `index` of a request in `group`'s layer."""
    return float(1 + index * 8 + group * 4 + layer)


def overlaid_kv_caches(groups: tuple[str, ...] = GROUPS) -> dict[str, torch.Tensor]:
    """Per-layer KV views as vLLM lays out two groups of one page size: layer i of every group
    views the same memory (a block id belongs to one group at a time)."""
    return stepped.overlaid_kv_caches(kv_cache_config(groups))


class HmaEngine(SteppedEngine):
    """A stepped engine over the two groups whose forward writes each block block_value (times
    sign)."""

    sign = 1

    def read(self, group: int, block_id: int, layer: int = 0) -> float:
        values = self.kv_caches[f"{GROUPS[group]}.{layer}"][block_id].float().unique()
        return float(values[0]) if len(values) == 1 else float("nan")

    def write_block(self, block: ComputedBlock) -> None:
        for layer in range(NUM_LAYERS):
            value = self.sign * block_value(block.group, block.index, layer)
            self.kv_caches[f"{GROUPS[block.group]}.{layer}"][block.block_id] = value


class Engine(HmaEngine):
    """A scheduler with the connector's scheduler half and one worker half, stepped by hand."""

    def __init__(self, model: Path, extra=None, groups=GROUPS, policy: str = "recompute"):
        super().__init__(
            vllm_config(model, extra, policy), kv_cache_config(groups), overlaid_kv_caches(groups)
        )

    @property
    def offload(self):
        """The scheduler half (OffloadScheduler) inside the traced connector."""
        return self.scheduler.connector.inner.scheduler

    def run(self, max_steps: int = 40) -> None:
        """Steps until no request is left (or loads still pending after max_steps)."""
        unfinished = self.scheduler.has_unfinished_requests
        self.run_until(lambda: not unfinished() and not self.offload.stores.in_flight, max_steps)

    def settle(self) -> None:
        worker = self.worker.inner.worker
        for job_id in list(worker._pending):
            worker.copies.wait(job_id)
        time.sleep(0.01)  # the CPU engine's thread posts the result right after the copy
