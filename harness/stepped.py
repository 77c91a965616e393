"""vLLM's real Scheduler and a connector's worker half over CPU KV tensors, stepped by hand."""

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
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
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorRole
from vllm.utils.hashing import sha256_cbor
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.engine import EngineCoreOutputs
from vllm.v1.kv_cache_interface import AttentionSpec, KVCacheConfig, KVCacheGroupSpec, KVCacheSpec
from vllm.v1.outputs import KVConnectorOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

from kvscope.harness.runner_output import runner_output

init_none_hash(sha256_cbor)


def stepped_vllm_config(
    model: Path,
    transfer: KVTransferConfig,
    num_blocks: int,
    block_size: int,
    hybrid: bool = False,
    **scheduler: Any,
) -> VllmConfig:
    """A CPU engine's config over `num_blocks` KV blocks. hybrid: vLLM's hybrid KV cache manager
    on (the CPU platform turns it off in a real engine); `scheduler`: SchedulerConfig fields
    other than the defaults here (max_num_seqs=8)."""
    config = VllmConfig(
        model_config=ModelConfig(model=str(model), skip_tokenizer_init=True, max_model_len=1024),
        scheduler_config=SchedulerConfig(
            **{"max_num_seqs": 8, **scheduler},
            max_num_batched_tokens=1024,
            max_model_len=1024,
            is_encoder_decoder=False,
        ),
        cache_config=CacheConfig(
            block_size=block_size, enable_prefix_caching=True, num_gpu_blocks_override=num_blocks
        ),
        kv_transfer_config=transfer,
        device_config=DeviceConfig("cpu"),
    )
    if hybrid:
        config.scheduler_config.disable_hybrid_kv_cache_manager = False
    config.cache_config.num_gpu_blocks = num_blocks
    return config


def stepped_kv_cache_config(
    num_blocks: int,
    groups: dict[str, KVCacheSpec],
    num_layers: int,
    cls: type[KVCacheConfig] = KVCacheConfig,
) -> KVCacheConfig:
    """One KV cache group per entry of `groups`, its layers named "<group>.<i>"."""
    return cls(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec([f"{name}.{i}" for i in range(num_layers)], spec)
            for name, spec in groups.items()
        ],
    )


def overlaid_kv_caches(kv_config: KVCacheConfig) -> dict[str, torch.Tensor]:
    """Per-layer KV views as vLLM lays out groups of one page size: layer i of every group views
    the same memory (a block id belongs to one group at a time)."""
    spec = kv_config.kv_cache_groups[0].kv_cache_spec
    assert isinstance(spec, AttentionSpec)
    shape = (kv_config.num_blocks, spec.num_kv_heads, spec.block_size, 2 * spec.head_size)
    caches: dict[str, torch.Tensor] = {}
    for names in zip(*(group.layer_names for group in kv_config.kv_cache_groups), strict=True):
        memory = torch.zeros(shape, dtype=spec.dtype)
        caches.update({name: memory.view(shape) for name in names})
    return caches


@functools.cache
def block_hasher(block_size: int) -> Callable[[Request], list[Any]]:
    """vLLM's block hasher (sha256_cbor) for a block size, one per size."""
    return get_request_block_hasher(block_size, sha256_cbor)


def stepped_request(req_id: str, prompt: list[int], max_tokens: int, block_size: int) -> Request:
    """A greedy request of max_tokens output tokens, its blocks hashed as vLLM's engine does."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    return Request(req_id, prompt, params, None, block_hasher=block_hasher(block_size))


@dataclass(frozen=True)
class ComputedBlock:
    """A block a step's forward computes: block `index` of a request's blocks in `group`."""

    req_id: str
    group: int
    index: int
    block_id: int


class SteppedEngine:
    """A scheduler with a connector's scheduler half and one worker half over KV tensors,
    stepped by hand. Subclasses say what the forward writes (write_block) and what runs after
    wait_for_save (settle)."""

    fills_partial_blocks = False
    """Whether the forward writes a request's partial last block too (else full blocks only)."""

    def __init__(
        self,
        config: VllmConfig,
        kv_config: KVCacheConfig,
        kv_caches: dict[str, torch.Tensor],
        scheduler_kv_config: KVCacheConfig | None = None,
        register: bool = True,
    ) -> None:
        """scheduler_kv_config: the scheduler's KVCacheConfig where it differs from the
        worker's; register: whether the worker half registers kv_caches here (a runner's own
        wrapper may)."""
        self.config, self.kv_config, self.kv_caches = config, kv_config, kv_caches
        self.block_size = kv_config.kv_cache_groups[0].kv_cache_spec.block_size
        self.scheduler = Scheduler(
            config,
            scheduler_kv_config or kv_config,
            StructuredOutputManager(config),
            block_size=self.block_size,
            log_stats=True,
        )
        self.worker: KVConnectorBase_V1 = KVConnectorFactory.create_connector(
            config, KVConnectorRole.WORKER, kv_config
        )
        if register:
            self.worker.register_kv_caches(kv_caches)
        self.outputs: list[KVConnectorOutput] = []  # the worker's, one a step
        self.metadata: list[Any] = []  # the scheduler half's, one a step
        self.params: dict[str, dict[str, Any]] = {}  # request id -> kv_transfer_params returned

    def add(self, req: Request) -> None:
        self.scheduler.add_request(req)

    def step(self) -> SchedulerOutput:
        """One engine step, the worker's hooks in model runner V1's order."""
        output = self.scheduler.schedule()
        self.finish_step(output, self.connector_step(output))
        return output

    def connector_step(self, output: SchedulerOutput) -> KVConnectorOutput:
        """The worker half's hooks around the forward, and what it hands the scheduler."""
        worker = self.worker
        assert output.kv_connector_metadata is not None  # the scheduler has a connector
        worker.bind_connector_metadata(output.kv_connector_metadata)
        worker.start_load_kv(None)  # type: ignore[arg-type]  # no forward context on the CPU
        self.forward(output)
        worker.wait_for_save()
        self.settle()
        results = worker.get_transfer_results(output.finished_req_ids)
        kv_output = KVConnectorOutput(
            finished_sending=results.finished_sending,
            finished_recving=results.finished_recving,
            failed_recving=results.failed_recving,
            invalid_block_ids=worker.get_block_ids_with_load_errors(),
            kv_connector_worker_meta=worker.build_connector_worker_meta(),
        )
        worker.clear_connector_metadata()
        return kv_output

    def finish_step(
        self, output: SchedulerOutput, kv_output: KVConnectorOutput | None
    ) -> dict[int, EngineCoreOutputs]:
        """The step's runner output (one token per request) back into the scheduler."""
        self.metadata.append(output.kv_connector_metadata)
        self.outputs.append(kv_output or KVConnectorOutput())
        engine_outputs = self.scheduler.update_from_output(output, runner_output(output, kv_output))
        for outputs in engine_outputs.values():
            for out in outputs.outputs:
                if out.kv_transfer_params:
                    self.params[out.request_id] = out.kv_transfer_params
        return engine_outputs

    def forward(self, output: SchedulerOutput) -> None:
        """The fake forward: write_block for each block the step computes."""
        for block in self.computed_blocks(output):
            self.write_block(block)

    def write_block(self, block: ComputedBlock) -> None:
        """What the forward writes into a block it computes: nothing here."""

    def settle(self) -> None:
        """What runs between wait_for_save and get_transfer_results: nothing here."""

    def computed_blocks(self, output: SchedulerOutput) -> Iterator[ComputedBlock]:
        """The blocks of every group the step's tokens fill (full blocks only unless
        fills_partial_blocks)."""
        manager = self.scheduler.kv_cache_manager
        for req_id, num_tokens in output.num_scheduled_tokens.items():
            done = self.scheduler.requests[req_id].num_computed_tokens  # counted by schedule()
            first, last = (done - num_tokens) // self.block_size, done // self.block_size
            if self.fills_partial_blocks:
                last = -(-done // self.block_size)
            for group, ids in enumerate(manager.get_block_ids(req_id)):
                for index in range(first, min(last, len(ids))):
                    yield ComputedBlock(req_id, group, index, ids[index])

    def run_until(
        self, done: Callable[[], bool], max_steps: int, failure: str = "requests still unfinished"
    ) -> None:
        """Steps until done() holds (asked before each step and after the last)."""
        for _ in range(max_steps):
            if done():
                return
            self.step()
        if not done():
            raise AssertionError(failure)

    def block_ids(self, req_id: str) -> tuple[list[int], ...]:
        """A request's block ids per group."""
        return self.scheduler.kv_cache_manager.get_block_ids(req_id)

    def free_blocks(self) -> int:
        return self.scheduler.kv_cache_manager.block_pool.get_num_free_blocks()

    def close(self) -> None:
        self.worker.shutdown()
