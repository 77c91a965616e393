"""Fixtures: the KV cache views vLLM 0.32 hands a connector (all six layouts, kernel blocks)."""

from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch

from kvscope.bench.transfer.kv_views import LAYOUT_ORDERS, KVShape, vllm_kv_layers
from kvscope.connector.cpu_offload.copy.host_buffer import BlockLayout, HostBuffer


@dataclass
class KVCache:
    """Per-layer KV tensors as an engine would hand them to a connector."""

    name: str
    layers: list[torch.Tensor]
    block_dim: int

    @property
    def num_blocks(self) -> int:
        return self.layers[0].shape[self.block_dim]

    def block(self, layer: int, device_block_id: int) -> torch.Tensor:
        return self.layers[layer].select(self.block_dim, device_block_id)

    def block_bits(self, device_block_id: int) -> torch.Tensor:
        """All layers of one block as int16, so equality is byte equality."""
        return torch.stack(
            [self.block(n, device_block_id).contiguous() for n in range(len(self.layers))]
        ).view(torch.int16)


def random_bf16(shape: tuple[int, ...], generator: torch.Generator, device: str) -> torch.Tensor:
    return torch.randn(shape, generator=generator).to(device=device, dtype=torch.bfloat16)


def build_kv_cache(name: str, num_blocks: int = 24, device: str = "cpu", seed: int = 0) -> KVCache:
    """vLLM's views of a layout by name ("LBNHC"; "LBHNC/k16": 16-token kernel blocks, so
    num_blocks rows from half as many blocks), or one of the older hand-made shapes."""
    generator = torch.Generator().manual_seed(seed)
    num_layers, heads, block_size, head_dim = 3, 2, 32, 16
    layout, _, kernel = name.partition("/k")
    if layout in LAYOUT_ORDERS:
        ratio = block_size // int(kernel) if kernel else 1
        kv = KVShape(num_layers, num_blocks // ratio, heads, block_size, head_dim)
        layers = vllm_kv_layers(layout, kv, device, seed, int(kernel) if kernel else None)
        return KVCache(name, layers, block_dim=0)
    if name == "cpu_layer_major":  # storage [L, nb, h, bs, 2d]: each layer contiguous
        shape = (num_layers, num_blocks, heads, block_size, 2 * head_dim)
        layers = list(random_bf16(shape, generator, device).unbind(0))
        return KVCache(name, layers, block_dim=0)
    if name == "cpu_block_major":  # storage [nb, L, h, bs, 2d]: layers are strided views
        shape = (num_blocks, num_layers, heads, block_size, 2 * head_dim)
        layers = list(random_bf16(shape, generator, device).unbind(1))
        return KVCache(name, layers, block_dim=0)
    if name == "flash":  # [2, nb, bs, h, d] per layer: no vLLM 0.32 connector gets this one
        shape = (2, num_blocks, block_size, heads, head_dim)
        layers = [random_bf16(shape, generator, device) for _ in range(num_layers)]
        return KVCache(name, layers, block_dim=1)
    raise ValueError(name)


LAYOUTS = [*LAYOUT_ORDERS, "LBHNC/k16", "LBNHC/k16"]
"""What vLLM 0.32 can hand register_kv_caches: six layouts, and kernel blocks (LB* only)."""

# (device_block_ids, host_block_ids): contiguous on both sides, scattered device ids into a
# host run, scattered on both sides, and reversed order.
BLOCK_PLANS = [
    ([3, 4, 5, 6], [0, 1, 2, 3]),
    ([17, 2, 9, 11, 5], [4, 5, 6, 7, 8]),
    ([1, 20, 7], [9, 2, 14]),
    ([12, 11, 10], [3, 2, 1]),
]


def build_host_buffer(kv: KVCache, num_host_blocks: int, pin_memory: bool = False) -> HostBuffer:
    layout = BlockLayout.of(kv.layers, kv.block_dim)
    return HostBuffer(layout, num_host_blocks, pin_memory)


@pytest.fixture(params=LAYOUTS)
def layout(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(params=BLOCK_PLANS, ids=["contiguous", "scattered", "both-scattered", "reversed"])
def block_plan(request: pytest.FixtureRequest) -> tuple[list[int], list[int]]:
    """(device_block_ids, host_block_ids) of one copy job."""
    return request.param


@pytest.fixture
def make_kv_cache() -> Callable[..., KVCache]:
    return build_kv_cache


@pytest.fixture
def make_host_buffer() -> Callable[..., HostBuffer]:
    return build_host_buffer
