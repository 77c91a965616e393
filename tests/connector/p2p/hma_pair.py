"""A prefill and a decode engine's parts under vLLM's hybrid KV cache manager, P2P between them.

Each side is vLLM's real Scheduler and KVCacheManager over two KV cache groups (full attention
+ a 64-token sliding window, CPU device config) with P2PConnector's scheduler half, and its
worker half over KV tensors overlaid as vLLM lays out groups, with a real NIXL agent and side
channel; the decode side READs the prefill side's blocks. The CPU platform turns the hybrid KV
cache manager off in a real engine, so the parts are stepped by hand. The fake forward writes
each computed block a value naming its group, index and layer, positive on the prefill side
and negative on the decode side, so a block says whose KV of which group landed in it.
"""

import time
from pathlib import Path
from typing import Any

from vllm.config import (
    CacheConfig,
    DeviceConfig,
    KVTransferConfig,
    ModelConfig,
    SchedulerConfig,
    VllmConfig,
)
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.outputs import KVConnectorOutput
from vllm.v1.structured_output import StructuredOutputManager

from kvscope.connector.p2p.connector import P2PConnector
from kvscope.harness.engine import free_port
from kvscope.harness.runner_output import runner_output
from tests.connector.cpu_offload.hma_harness import (
    BLOCK,
    GROUPS,
    NUM_BLOCKS,
    NUM_LAYERS,
    block_value,
    kv_cache_config,
    overlaid_kv_caches,
)


def p2p_vllm_config(model: Path, engine_id: str, port: int, policy: str) -> VllmConfig:
    transfer = KVTransferConfig(
        kv_connector="P2PConnector",
        kv_connector_module_path="kvscope.connector.p2p.connector",
        kv_role="kv_both",
        engine_id=engine_id,
        kv_load_failure_policy=policy,
        kv_connector_extra_config={
            "side_channel_port": port,
            "lease_timeout_s": 30,
            "read_timeout_s": 10,
        },
    )
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


class Side:
    """One engine: a scheduler with P2P's scheduler half and one worker half, stepped by hand."""

    def __init__(self, model: Path, engine_id: str, sign: int, policy: str = "recompute"):
        self.config = p2p_vllm_config(model, engine_id, free_port(), policy)
        self.kv_config = kv_cache_config()
        self.scheduler = Scheduler(
            self.config,
            self.kv_config,
            StructuredOutputManager(self.config),
            block_size=BLOCK,
            log_stats=True,
        )
        self.worker = P2PConnector(self.config, KVConnectorRole.WORKER, self.kv_config)
        self.kv_caches = overlaid_kv_caches()
        self.worker.register_kv_caches(self.kv_caches)
        self.sign = sign
        self.outputs: list[KVConnectorOutput] = []
        self.metadata: list[Any] = []
        self.params: dict[str, dict] = {}  # request id -> kv_transfer_params it returned

    @property
    def p2p(self):
        """The scheduler half (P2PScheduler) inside the traced connector."""
        return self.scheduler.connector.inner.scheduler

    def step(self) -> None:
        output = self.scheduler.schedule()
        self.metadata.append(output.kv_connector_metadata)
        self.worker.bind_connector_metadata(output.kv_connector_metadata)
        self.worker.start_load_kv(None)
        self._forward(output)
        self.worker.wait_for_save()
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
        for engine_outputs in self.scheduler.update_from_output(output, runner).values():
            for out in engine_outputs.outputs:
                if out.kv_transfer_params:
                    self.params[out.request_id] = out.kv_transfer_params

    def block_ids(self, req_id: str) -> tuple[list[int], ...]:
        return self.scheduler.kv_cache_manager.get_block_ids(req_id)

    def read(self, group: int, block_id: int, layer: int = 0) -> float:
        values = self.kv_caches[f"{GROUPS[group]}.{layer}"][block_id].float().unique()
        return float(values[0]) if len(values) == 1 else float("nan")

    def free_blocks(self) -> int:
        return self.scheduler.kv_cache_manager.block_pool.get_num_free_blocks()

    def close(self) -> None:
        self.worker.shutdown()

    def _forward(self, output: Any) -> None:
        manager = self.scheduler.kv_cache_manager
        for req_id, num_tokens in output.num_scheduled_tokens.items():
            done = self.scheduler.requests[req_id].num_computed_tokens  # counted by schedule()
            first, last = (done - num_tokens) // BLOCK, -(-done // BLOCK)
            for group, ids in enumerate(manager.get_block_ids(req_id)):
                for index in range(first, min(last, len(ids))):
                    for layer in range(NUM_LAYERS):
                        value = self.sign * block_value(group, index, layer)
                        self.kv_caches[f"{GROUPS[group]}.{layer}"][ids[index]] = value


def pump(sides: list[Side], done: Any, timeout_s: float = 20.0) -> None:
    """Steps every side until done() (NIXL moves bytes between steps), or fails at timeout."""
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError("timed out stepping the P/D pair")
        for side in sides:
            side.step()
        time.sleep(0.005)


def recved(side: Side, req_id: str) -> bool:
    return bool(side.outputs) and req_id in (side.outputs[-1].finished_recving or ())
