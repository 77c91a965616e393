"""Preallocated host memory for offloaded KV blocks, layer-major: a host block run is one range."""

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from kvscope.connector.common.host_pool import num_host_blocks


def find_block_dim(shape: Sequence[int], num_blocks: int) -> int:
    """The one dimension of a KV layer tensor whose size is num_blocks; raises if ambiguous."""
    matches = [dim for dim, size in enumerate(shape) if size == num_blocks]
    if len(matches) != 1:
        raise ValueError(
            f"cannot tell the block dimension of KV shape {tuple(shape)} with {num_blocks} "
            f"blocks ({len(matches)} candidates): pass block_dim explicitly"
        )
    return matches[0]


@dataclass(frozen=True)
class BlockLayout:
    """How the engine's per-layer KV tensors hold blocks, as far as copying is concerned."""

    num_layers: int
    block_dim: int
    layer_block_shape: tuple[int, ...]  # one layer's block: the layer shape without block_dim
    dtype: torch.dtype
    num_device_blocks: int

    @classmethod
    def of(cls, kv_layers: Sequence[torch.Tensor], block_dim: int) -> "BlockLayout":
        if not kv_layers:
            raise ValueError("no KV layers given")
        first = kv_layers[0]
        for layer in kv_layers:
            if layer.shape != first.shape or layer.dtype != first.dtype:
                raise ValueError(
                    f"all KV layers must share shape and dtype: {tuple(layer.shape)} "
                    f"{layer.dtype} vs {tuple(first.shape)} {first.dtype}"
                )
            if layer.device != first.device:
                raise ValueError(f"KV layers on two devices: {layer.device} and {first.device}")
        if not 0 <= block_dim < first.dim():
            raise ValueError(f"block_dim {block_dim} out of range for shape {tuple(first.shape)}")
        shape = tuple(first.shape)
        return cls(
            num_layers=len(kv_layers),
            block_dim=block_dim,
            layer_block_shape=shape[:block_dim] + shape[block_dim + 1 :],
            dtype=first.dtype,
            num_device_blocks=shape[block_dim],
        )

    @property
    def bytes_per_layer_block(self) -> int:
        return math.prod(self.layer_block_shape) * self.dtype.itemsize

    @property
    def bytes_per_block(self) -> int:
        """One block across all layers: the unit the host byte budget is divided into."""
        return self.num_layers * self.bytes_per_layer_block


class HostBuffer:
    """Host tensors, one per layer, each [num_blocks, *layer_block_shape], over one allocation."""

    def __init__(self, layout: BlockLayout, num_blocks: int, pin_memory: bool = False):
        if num_blocks <= 0:
            raise ValueError(
                f"host buffer needs at least one block of {layout.bytes_per_block} bytes: "
                "raise cpu_bytes_to_use"
            )
        self.layout: BlockLayout = layout
        self.num_blocks: int = num_blocks
        self.pinned: bool = bool(pin_memory and torch.cuda.is_available())
        shape = (layout.num_layers, num_blocks, *layout.layer_block_shape)
        self.storage: torch.Tensor = torch.empty(shape, dtype=layout.dtype, pin_memory=self.pinned)
        # Touch every page now, so the first stores do not pay page faults on the engine's time.
        self.storage.zero_()
        self.layers: list[torch.Tensor] = list(self.storage.unbind(0))

    @classmethod
    def with_capacity(
        cls, layout: BlockLayout, cpu_bytes_to_use: int, pin_memory: bool = False
    ) -> "HostBuffer":
        return cls(layout, num_host_blocks(cpu_bytes_to_use, layout.bytes_per_block), pin_memory)

    @property
    def nbytes(self) -> int:
        return self.storage.numel() * self.storage.element_size()

    def block(self, host_block_id: int) -> torch.Tensor:
        """All layers of one host block, [num_layers, *layer_block_shape] (a view)."""
        return self.storage[:, host_block_id]
