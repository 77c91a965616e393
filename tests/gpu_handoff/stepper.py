"""vLLM's real Scheduler and a connector's worker half over a GPU hand-off, stepped by hand.

The scheduler builds the connector's scheduler half from the KVCacheConfig the engine core gives
it; the worker half is built from the worker's config and registers the hand-off's views, as a
GPU worker does. The "forward" writes into each block it computes a byte pattern that names the
request, group, block index and layer, so a loaded block says whose KV landed in it and in what
order its bytes came back.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Final

import torch
from vllm.config import KVTransferConfig

from kvscope.harness.stepped import ComputedBlock, SteppedEngine, stepped_request

if TYPE_CHECKING:
    from tests.gpu_handoff.builder import HandOff

SENTINEL: Final = 0xA5
"""The byte every KV block holds after clobber(): a load must change only the blocks it names."""
OFFLOAD_MODULE: Final = "kvscope.connector.cpu_offload.connector"
"""Where the traced offload connector lives."""
CONNECTORS: Final = ("core", "traced", "multi")
"""The connector set-ups over the offload connector: untraced, traced, and inside a Multi."""


def offload_transfer_config(setup: str, extra: dict[str, Any] | None = None) -> KVTransferConfig:
    """The offload connector untraced ("core"), traced, or as the one child of a Multi."""
    extra = {"cpu_bytes_to_use": 4 << 20, **(extra or {})}
    if setup == "multi":
        child = {
            "name": "offload",
            "kv_connector": "CpuOffloadConnector",
            "kv_connector_module_path": OFFLOAD_MODULE,
            "kv_connector_extra_config": extra,
        }
        return KVTransferConfig(
            kv_connector="KvscopeMultiConnector",
            kv_role="kv_both",
            kv_connector_module_path="kvscope.connector.multi.connector",
            kv_connector_extra_config={"connectors": [child]},
        )
    core = setup == "core"
    return KVTransferConfig(
        kv_connector="CpuOffloadCore" if core else "CpuOffloadConnector",
        kv_connector_module_path="kvscope.connector.cpu_offload.core" if core else OFFLOAD_MODULE,
        kv_role="kv_both",
        kv_connector_extra_config=extra,
    )


def pattern(numel: int, req_id: str, group: int, index: int, layer: int) -> torch.Tensor:
    """Bytes that differ from element to element and between any two blocks' fills."""
    seed = sum(req_id.encode()) * 131 + group * 61 + index * 17 + layer * 7
    return ((torch.arange(numel, dtype=torch.int64) * 7 + seed) % 251).to(torch.uint8)


class HandOffEngine(SteppedEngine):
    """A scheduler with the connector's scheduler half and one worker half, stepped by hand."""

    def __init__(self, handoff: HandOff):
        self.handoff = handoff
        super().__init__(
            handoff.vllm_config,
            handoff.kv_cache_config,
            handoff.kv_caches,
            scheduler_kv_config=handoff.scheduler_kv_cache_config,
        )
        # Layers that own KV, per group: KV-sharing layers write nowhere of their own.
        self.group_layers = [g.layer_names for g in handoff.kv_cache_config.kv_cache_groups]
        # Each request's block ids when it last ran (vLLM forgets them when it finishes).
        self.request_blocks: dict[str, tuple[list[int], ...]] = {}

    def add(self, req_id: str, prompt: list[int], max_tokens: int = 1) -> None:
        super().add(stepped_request(req_id, prompt, max_tokens, self.block_size))

    def settle(self) -> None:
        time.sleep(0.01)  # the CPU copy thread posts results right after each copy

    def run_until_idle(self, max_steps: int = 60) -> None:
        """Steps until every request finished and vLLM's prefix cache could be emptied (which
        needs the connector to have let go of every block it was storing)."""
        scheduler = self.scheduler
        self.run_until(
            lambda: not scheduler.has_unfinished_requests() and scheduler.reset_prefix_cache(),
            max_steps,
            "requests or stores still unfinished",
        )

    def block_ids(self, req_id: str) -> tuple[list[int], ...]:
        """A request's block ids per group, now or when it last ran."""
        if req_id in self.scheduler.requests:
            return super().block_ids(req_id)
        return self.request_blocks[req_id]

    def clobber(self) -> None:
        """Every block of every layer set to SENTINEL: what is not loaded stays so."""
        for view in self.handoff.kv_caches.values():
            view.view(torch.uint8).fill_(SENTINEL)

    def written(self, req_id: str, group: int, index: int, layer_name: str) -> torch.Tensor:
        """The bytes the forward of req_id wrote into its block `index` of this layer."""
        layer = self.group_layers[group].index(layer_name)
        numel = self.handoff.block_bytes(layer_name, 0).numel()
        return pattern(numel, req_id, group, index, layer)

    def forward(self, output: Any) -> None:
        for req_id in output.num_scheduled_tokens:
            self.request_blocks[req_id] = self.block_ids(req_id)
        super().forward(output)

    def write_block(self, block: ComputedBlock) -> None:
        for layer_name in self.group_layers[block.group]:
            data = self.written(block.req_id, block.group, block.index, layer_name)
            view = self.handoff.kv_caches[layer_name]
            ratio = view.shape[0] // self.handoff.num_blocks
            rows = view[block.block_id * ratio : (block.block_id + 1) * ratio]
            rows.view(torch.uint8).copy_(data.view(rows.view(torch.uint8).shape))
