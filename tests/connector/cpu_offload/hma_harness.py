"""vLLM's real Scheduler over two KV cache groups (full + sliding window) with the offload
connector's scheduler half, and its worker half over KV tensors laid out as vLLM overlays groups.

The CPU platform turns the hybrid KV cache manager off in a real engine, so these tests drive
the engine's parts directly, as vLLM's own scheduler tests do, with a CPU device config. The
"forward" writes a value into each block it computes that names the block's group, index and
layer, so a loaded block says whether the right group's KV landed in it.
"""

import time
from pathlib import Path
from typing import Any

import torch
from vllm import SamplingParams
from vllm.config import (
    CacheConfig,
    DeviceConfig,
    KVTransferConfig,
    ModelConfig,
    SchedulerConfig,
    VllmConfig,
)
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.utils.hashing import sha256_cbor
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    SlidingWindowSpec,
)
from vllm.v1.outputs import KVConnectorOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

from kvscope.connector.cpu_offload.connector import CpuOffloadConnector
from kvscope.harness import configs
from kvscope.harness.runner_output import runner_output

BLOCK = 32
WINDOW = 64  # tokens: a hit needs cdiv(63, 32) = 2 window blocks of the sliding-window group
NUM_BLOCKS = 96
NUM_LAYERS = 2
HEADS, HEAD_DIM = 2, 32
GROUPS = ("full", "swa")
init_none_hash(sha256_cbor)
HASHER = get_request_block_hasher(BLOCK, sha256_cbor)


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
    return KVCacheConfig(
        num_blocks=NUM_BLOCKS,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec([f"{g}.{i}" for i in range(NUM_LAYERS)], specs[g]) for g in groups
        ],
    )


def vllm_config(
    model: Path, extra: dict[str, Any] | None = None, policy: str = "recompute"
) -> VllmConfig:
    offload = configs.offload_config(policy, **{"cpu_bytes_to_use": 2 << 20, **(extra or {})})
    transfer = KVTransferConfig(**offload)
    config = VllmConfig(
        model_config=ModelConfig(model=str(model), skip_tokenizer_init=True, max_model_len=1024),
        scheduler_config=SchedulerConfig(
            max_num_seqs=8,
            max_num_batched_tokens=1024,
            max_model_len=1024,
            is_encoder_decoder=False,
        ),
        cache_config=CacheConfig(
            block_size=BLOCK, enable_prefix_caching=True, num_gpu_blocks_override=NUM_BLOCKS
        ),
        kv_transfer_config=transfer,
        device_config=DeviceConfig("cpu"),
    )
    config.scheduler_config.disable_hybrid_kv_cache_manager = False
    config.cache_config.num_gpu_blocks = NUM_BLOCKS
    return config


def request(req_id: str, prompt: list[int], max_tokens: int = 2) -> Request:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    return Request(req_id, prompt, params, None, block_hasher=HASHER)


def block_value(group: int, index: int, layer: int) -> float:
    """What the fake forward writes into block `index` of a request in `group`'s layer."""
    return float(1 + index * 8 + group * 4 + layer)


class Engine:
    """A scheduler with the connector's scheduler half and one worker half, stepped by hand."""

    def __init__(self, model: Path, extra=None, groups=GROUPS, policy: str = "recompute"):
        self.config = vllm_config(model, extra, policy)
        self.kv_config = kv_cache_config(groups)
        self.scheduler = Scheduler(
            self.config,
            self.kv_config,
            StructuredOutputManager(self.config),
            block_size=BLOCK,
            log_stats=True,
        )
        self.worker = CpuOffloadConnector(self.config, KVConnectorRole.WORKER, self.kv_config)
        self.kv_caches = overlaid_kv_caches(groups)
        self.worker.register_kv_caches(self.kv_caches)
        self.outputs: list[KVConnectorOutput] = []

    @property
    def offload(self):
        """The scheduler half (OffloadScheduler) inside the traced connector."""
        return self.scheduler.connector.inner.scheduler

    def add(self, req: Request) -> None:
        self.scheduler.add_request(req)

    def step(self) -> Any:
        output = self.scheduler.schedule()
        self.worker.bind_connector_metadata(output.kv_connector_metadata)
        self.worker.start_load_kv(None)
        self._forward(output)
        self.worker.wait_for_save()
        self._wait_for_copies()
        results = self.worker.get_transfer_results(output.finished_req_ids)
        kv_output = KVConnectorOutput(
            finished_sending=results.finished_sending,
            finished_recving=results.finished_recving,
            failed_recving=results.failed_recving,
            invalid_block_ids=self.worker.get_block_ids_with_load_errors(),
            kv_connector_worker_meta=self.worker.build_connector_worker_meta(),
        )
        self.worker.clear_connector_metadata()
        self.outputs.append(kv_output)
        runner = runner_output(output, kv_output)
        self.scheduler.update_from_output(output, runner)
        return output

    def run(self, max_steps: int = 40) -> None:
        """Steps until no request is left (or loads still pending after max_steps)."""
        for _ in range(max_steps):
            if not self.scheduler.has_unfinished_requests() and not self.offload.stores.in_flight:
                return
            self.step()
        raise AssertionError("requests still unfinished")

    def block_ids(self, req_id: str) -> tuple[list[int], ...]:
        return self.scheduler.kv_cache_manager.get_block_ids(req_id)

    def read(self, group: int, block_id: int, layer: int = 0) -> float:
        name = f"{GROUPS[group]}.{layer}"
        values = self.kv_caches[name][block_id].float().unique()
        return float(values[0]) if len(values) == 1 else float("nan")

    def _forward(self, output: Any) -> None:
        """Writes each computed block of each group (full blocks only) a value naming it."""
        manager = self.scheduler.kv_cache_manager
        for req_id, num_tokens in output.num_scheduled_tokens.items():
            # schedule() already counted this step's tokens as computed
            done = self.scheduler.requests[req_id].num_computed_tokens
            first, last = (done - num_tokens) // BLOCK, done // BLOCK
            for group, ids in enumerate(manager.get_block_ids(req_id)):
                for index in range(first, min(last, len(ids))):
                    for layer in range(NUM_LAYERS):
                        view = self.kv_caches[f"{GROUPS[group]}.{layer}"]
                        view[ids[index]] = block_value(group, index, layer)

    def _wait_for_copies(self) -> None:
        worker = self.worker.inner.worker
        for job_id in list(worker._pending):
            worker.copies.wait(job_id)
        time.sleep(0.01)  # the CPU engine's thread posts the result right after the copy


def overlaid_kv_caches(groups: tuple[str, ...] = GROUPS) -> dict[str, torch.Tensor]:
    """Per-layer KV views as vLLM lays out two groups of one page size: layer i of every group
    views the same memory (a block id belongs to one group at a time)."""
    caches: dict[str, torch.Tensor] = {}
    for layer in range(NUM_LAYERS):
        memory = torch.zeros(NUM_BLOCKS, HEADS, BLOCK, 2 * HEAD_DIM, dtype=torch.bfloat16)
        for group in groups:
            caches[f"{group}.{layer}"] = memory.view(memory.shape)
    return caches
