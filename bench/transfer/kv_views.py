"""vLLM 0.32's per-layer KV cache views, rebuilt with torch alone for machines without vLLM."""

# Mirrors vllm.v1.kv_cache_interface.compute_layout_strides and create_kv_cache_views for full
# attention (no padded pages); tests/connector/cpu_offload/copy/test_copy_views.py checks it
# against them, so the GPU machine, which has no vLLM, copies through exactly what vLLM hands over.

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import torch

LAYOUT_ORDERS: Final[dict[str, tuple[int, ...]]] = {
    "LBHNC": (0, 1, 2, 3, 4),
    "LBNHC": (0, 1, 3, 2, 4),
    "LHBNC": (0, 2, 1, 3, 4),
    "BLHNC": (1, 0, 2, 3, 4),
    "BLNHC": (1, 0, 3, 2, 4),
    "BHLNC": (1, 2, 0, 3, 4),
}
"""vLLM's KVCacheLayout values: the logical [L, B, H, N, C] axes in physical order."""


@dataclass(frozen=True)
class KVShape:
    """One KV cache tensor's layers of full attention: K and V of a token along C."""

    num_layers: int = 3
    num_blocks: int = 24
    num_kv_heads: int = 2
    block_size: int = 32
    head_size: int = 16
    dtype: torch.dtype = torch.bfloat16

    @property
    def content_bytes(self) -> int:
        return 2 * self.head_size * self.dtype.itemsize

    @property
    def page_bytes(self) -> int:
        return self.num_kv_heads * self.block_size * self.content_bytes

    @property
    def nbytes(self) -> int:
        return self.num_layers * self.num_blocks * self.page_bytes


def layout_strides(
    shape: Sequence[int], order: Sequence[int], fixed: Sequence[int | None] = (None,) * 5
) -> tuple[int, ...]:
    """Byte strides of logical [L, B, H, N, C] for a physical order (compute_layout_strides)."""
    strides = [0] * 5
    current = 1
    for dim in reversed(order):
        strides[dim] = fixed[dim] or current
        current = strides[dim] * shape[dim]
    return tuple(strides)


def kv_views(
    raw: torch.Tensor, kv: KVShape, layout: str, kernel_block_size: int | None = None
) -> list[torch.Tensor]:
    """The [B, H, N, C] view of each layer vLLM's GPU worker registers, over raw (int8 bytes).

    With kernel_block_size below the block size, each block is split into kernel blocks:
    B grows by the ratio, as for FlashInfer on Hopper (16/32/64-token kernel blocks).
    """
    order = LAYOUT_ORDERS[layout]
    manager = (kv.num_layers, kv.num_blocks, kv.num_kv_heads, kv.block_size, kv.content_bytes)
    layer_stride, block_stride, *_ = layout_strides(manager, order)
    kernel = kernel_block_size or kv.block_size
    if kv.block_size % kernel:
        raise ValueError(f"kernel block size {kernel} must divide block size {kv.block_size}")
    ratio = kv.block_size // kernel
    if ratio > 1:
        if block_stride != kv.page_bytes:
            raise ValueError(
                f"{layout} does not store blocks as dense pages: vLLM refuses to split "
                f"them into kernel blocks of {kernel} tokens"
            )
        block_stride //= ratio
    shape = (kv.num_layers, kv.num_blocks * ratio, kv.num_kv_heads, kernel, kv.content_bytes)
    strides = layout_strides(shape, order, (layer_stride, block_stride, None, None, None))
    view_5d = torch.as_strided(raw, shape, strides, raw.storage_offset())
    return [view_5d[layer].view(kv.dtype) for layer in range(kv.num_layers)]


def allocate_kv(kv: KVShape, device: str | torch.device, seed: int = 0) -> torch.Tensor:
    """The raw int8 allocation of one KV cache tensor, filled with random bytes."""
    generator = torch.Generator(device=device).manual_seed(seed)
    return torch.randint(
        -128, 128, (kv.nbytes,), dtype=torch.int8, generator=generator, device=device
    )


def vllm_kv_layers(
    layout: str,
    kv: KVShape = KVShape(),
    device: str | torch.device = "cpu",
    seed: int = 0,
    kernel_block_size: int | None = None,
) -> list[torch.Tensor]:
    """Random KV in vLLM's views of one layout, ready for register_kv_caches."""
    return kv_views(allocate_kv(kv, device, seed), kv, layout, kernel_block_size)


def view_bytes(view: torch.Tensor) -> int:
    """Bytes a view spans, first to last element."""
    extent = sum(
        (size - 1) * stride for size, stride in zip(view.shape, view.stride(), strict=True)
    )
    return (extent + 1) * view.element_size() if math.prod(view.shape) else 0
