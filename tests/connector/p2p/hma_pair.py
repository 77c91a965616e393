"""A prefill and a decode engine's parts under vLLM's hybrid KV cache manager, P2P between them.

Each side is vLLM's real Scheduler and KVCacheManager over two KV cache groups (full attention
+ a 64-token sliding window, CPU device config) with P2PConnector's scheduler half, and its
worker half over KV tensors overlaid as vLLM lays out groups, with a real NIXL agent and side
channel; the decode side READs the prefill side's blocks. The CPU platform turns the hybrid KV
cache manager off in a real engine, so the parts are stepped by hand (harness.stepped). The fake
forward writes each computed block a value naming its group, index and layer, positive on the
prefill side and negative on the decode side, so a block says whose KV of which group landed in
it.
"""

import time
from pathlib import Path
from typing import Any

from vllm.config import KVTransferConfig, VllmConfig

from kvscope.harness.engine import free_port
from kvscope.harness.stepped import stepped_vllm_config
from tests.connector.cpu_offload.hma_harness import (
    BLOCK,
    NUM_BLOCKS,
    HmaEngine,
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
    return stepped_vllm_config(model, transfer, NUM_BLOCKS, BLOCK, hybrid=True)


class Side(HmaEngine):
    """One engine: a scheduler with P2P's scheduler half and one worker half, stepped by hand;
    its forward writes partial blocks too. `params`: each request's kv_transfer_params."""

    fills_partial_blocks = True

    def __init__(self, model: Path, engine_id: str, sign: int, policy: str = "recompute"):
        config = p2p_vllm_config(model, engine_id, free_port(), policy)
        super().__init__(config, kv_cache_config(), overlaid_kv_caches())
        self.sign = sign

    @property
    def p2p(self):
        """The scheduler half (P2PScheduler) inside the traced connector."""
        return self.scheduler.connector.inner.scheduler


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
