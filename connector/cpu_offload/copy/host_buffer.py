"""Preallocated host memory for offloaded KV blocks, laid out as the device holds its blocks."""

import math
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import torch

from kvscope.connector.cpu_offload.copy.host_pinning import (
    PinnedRange,
    chunk_blocks,
    pin_tables,
    unpin_ranges,
)
from kvscope.connector.cpu_offload.host_pool import num_host_blocks

PAGE_BYTES: Final = 4096
"""Host page size the allocation is aligned to, so registration chunks never share a page."""


def find_block_dim(shape: Sequence[int], num_blocks: int) -> int:
    """The one dimension of a KV layer tensor whose size is num_blocks; raises if ambiguous."""
    matches = [dim for dim, size in enumerate(shape) if size == num_blocks]
    if len(matches) != 1:
        raise ValueError(
            f"cannot tell the block dimension of KV shape {tuple(shape)} with {num_blocks} "
            f"blocks ({len(matches)} candidates): pass block_dim explicitly"
        )
    return matches[0]


def dense_order(shape: Sequence[int], strides: Sequence[int]) -> tuple[int, ...] | None:
    """The dims outermost-first in memory when they fill one dense range, else None."""
    order = sorted(range(len(shape)), key=lambda dim: (-strides[dim], dim))
    expected = 1
    for dim in reversed(order):
        if shape[dim] != 1 and strides[dim] != expected:
            return None
        expected *= shape[dim]
    return tuple(order)


def strides_in_order(shape: Sequence[int], order: Sequence[int]) -> tuple[int, ...]:
    """Dense strides for shape, with dims laid out in memory in the given outermost-first order."""
    strides = [0] * len(shape)
    step = 1
    for dim in reversed(order):
        strides[dim] = step
        step *= shape[dim]
    return tuple(strides)


@dataclass(frozen=True)
class BlockLayout:
    """How the engine's per-layer KV tensors hold blocks, as far as copying is concerned.

    block_order is set when each layer's block is one dense range of memory (vLLM's LB*C and
    BL*C layouts, not LHBNC or BHLNC): the host mirrors that order, so a block moves as raw
    bytes. block_major is set when one block across all layers is one dense range (BLHNC,
    BLNHC, as NIXL asks for): the host keeps blocks outermost too, so a run is one copy.
    """

    num_layers: int
    block_dim: int
    layer_block_shape: tuple[int, ...]  # one layer's block: the layer shape without block_dim
    dtype: torch.dtype
    num_device_blocks: int
    block_order: tuple[int, ...] | None = None  # layer_block_shape dims, outermost first
    block_stride: int = 0  # elements between two blocks of a layer on the device
    block_major: bool = False

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
        layer_block_shape = shape[:block_dim] + shape[block_dim + 1 :]
        inner_strides = first.stride()[:block_dim] + first.stride()[block_dim + 1 :]
        same_strides = all(layer.stride() == first.stride() for layer in kv_layers)
        order = dense_order(layer_block_shape, inner_strides) if same_strides else None
        block_stride = first.stride(block_dim)
        if order is not None and block_stride < math.prod(layer_block_shape):
            order = None  # blocks overlap: not a layout vLLM makes; copy view by view
        return cls(
            num_layers=len(kv_layers),
            block_dim=block_dim,
            layer_block_shape=layer_block_shape,
            dtype=first.dtype,
            num_device_blocks=shape[block_dim],
            block_order=order,
            block_stride=block_stride,
            block_major=order is not None
            and _blocks_span_layers(kv_layers, block_stride, math.prod(layer_block_shape)),
        )

    @property
    def layer_block_numel(self) -> int:
        return math.prod(self.layer_block_shape)

    @property
    def bytes_per_layer_block(self) -> int:
        return self.layer_block_numel * self.dtype.itemsize

    @property
    def bytes_per_block(self) -> int:
        """One block across all layers: the unit the host byte budget is divided into."""
        return self.num_layers * self.bytes_per_layer_block

    @property
    def raw_rows(self) -> bool:
        """Blocks move as rows of raw elements, no reordering (block_order is known)."""
        return self.block_order is not None

    def device_rows(self, kv_layers: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """The KV layers as 2-D tables of raw rows a block each, matching HostBuffer.rows()."""
        numel = self.layer_block_numel
        if self.block_major:
            first = kv_layers[0]
            shape = (self.num_device_blocks, self.num_layers * numel)
            return [first.as_strided(shape, (self.block_stride, 1), first.storage_offset())]
        shape = (self.num_device_blocks, numel)
        return [
            layer.as_strided(shape, (self.block_stride, 1), layer.storage_offset())
            for layer in kv_layers
        ]

    def host_strides(self, num_blocks: int) -> tuple[int, ...]:
        """Strides of the host's [num_layers, num_blocks, *layer_block_shape] storage."""
        inner = strides_in_order(
            self.layer_block_shape, self.block_order or range(len(self.layer_block_shape))
        )
        numel = self.layer_block_numel
        if self.block_major:
            return (numel, self.num_layers * numel, *inner)
        return (num_blocks * numel, numel, *inner)


def _blocks_span_layers(kv_layers: Sequence[torch.Tensor], block_stride: int, page: int) -> bool:
    """One block of every layer is one dense range: layers a page apart, blocks L pages."""
    first = kv_layers[0]
    if len(kv_layers) < 2 or page == 0 or block_stride != len(kv_layers) * page:
        return False
    storage = first.untyped_storage().data_ptr()
    return all(
        layer.untyped_storage().data_ptr() == storage
        and layer.storage_offset() - first.storage_offset() == index * page
        for index, layer in enumerate(kv_layers)
    )


class HostBuffer:
    """Host tensors, one per layer, each [num_blocks, *layer_block_shape], over one allocation.

    The memory is allocated pageable and, for CUDA, page-locked with cudaHostRegister in
    chunks, as vLLM's offloaders do: torch's pinned allocator rounds each allocation up to a
    power of two (a 40 GiB pool takes 64 GiB; 65 GiB fails on a 128 GiB host). It is never
    zeroed here: registering faults every page in already, and unregistered (CPU) pages
    come in on the first store, on the copy thread rather than at engine start.
    """

    def __init__(
        self,
        layout: BlockLayout,
        num_blocks: int,
        pin_memory: bool = False,
        memory: torch.Tensor | None = None,  # numel elements given (e.g. shared), not allocated
    ):
        if num_blocks <= 0:
            raise ValueError(
                f"host buffer needs at least one block of {layout.bytes_per_block} bytes: "
                "raise cpu_bytes_to_use"
            )
        self.layout: BlockLayout = layout
        self.num_blocks: int = num_blocks
        numel = layout.num_layers * num_blocks * layout.layer_block_numel
        if memory is not None and (memory.numel(), memory.dtype) != (numel, layout.dtype):
            raise ValueError(f"host memory of {memory.numel()} {memory.dtype}: {numel} needed")
        self._memory: torch.Tensor = (
            _page_aligned(numel, layout.dtype) if memory is None else memory
        )
        self.pinned_ranges: list[PinnedRange] = []
        if pin_memory and torch.cuda.is_available():
            self.pinned_ranges = pin_tables(self._tables(), self.row_bytes)
        self._unpin = weakref.finalize(self, unpin_ranges, self.pinned_ranges, self._memory)
        self.pinned: bool = bool(self.pinned_ranges)
        shape = (layout.num_layers, num_blocks, *layout.layer_block_shape)
        self.storage: torch.Tensor = self._memory.as_strided(shape, layout.host_strides(num_blocks))
        self.layers: list[torch.Tensor] = list(self.storage.unbind(0))

    @classmethod
    def with_capacity(
        cls, layout: BlockLayout, cpu_bytes_to_use: int, pin_memory: bool = False
    ) -> "HostBuffer":
        return cls(layout, num_host_blocks(cpu_bytes_to_use, layout.bytes_per_block), pin_memory)

    @property
    def nbytes(self) -> int:
        return self._memory.numel() * self._memory.element_size()

    @property
    def row_bytes(self) -> int:
        """Bytes of one block in one table: all layers' (block-major) or one layer's."""
        numel = self.layout.layer_block_numel * (
            self.layout.num_layers if self.layout.block_major else 1
        )
        return numel * self.layout.dtype.itemsize

    @property
    def registration_blocks(self) -> int | None:
        """Host blocks per registration chunk while pinned (a copy run must not cross a
        multiple of it: two registrations), None when the memory is pageable."""
        return chunk_blocks(self.row_bytes) if self.pinned else None

    def _tables(self) -> list[tuple[int, int]]:
        """(address, rows) of each table of block rows: one, or one per layer."""
        base = self._memory.data_ptr()
        if self.layout.block_major:
            return [(base, self.num_blocks)]
        table_bytes = self.num_blocks * self.row_bytes
        return [(base + i * table_bytes, self.num_blocks) for i in range(self.layout.num_layers)]

    @property
    def registered_bytes(self) -> int:
        """Bytes page-locked with the CUDA driver (0 on the CPU or after close)."""
        return sum(pinned.num_bytes for pinned in self.pinned_ranges)

    def rows(self) -> list[torch.Tensor]:
        """The buffer as 2-D tables of raw rows a block each, [num_blocks, row] (raw_rows only).

        One table per layer, or one for all layers when the layout is block-major.
        """
        numel = self.layout.layer_block_numel
        if self.layout.block_major:
            return [self._memory.view(self.num_blocks, self.layout.num_layers * numel)]
        return list(self._memory.view(self.layout.num_layers, self.num_blocks, numel).unbind(0))

    def block(self, host_block_id: int) -> torch.Tensor:
        """All layers of one host block, [num_layers, *layer_block_shape] (a view)."""
        return self.storage[:, host_block_id]

    def close(self) -> None:
        """Unregisters the memory from the CUDA driver; call once no copy uses the buffer."""
        self._unpin()
        self.pinned = False


def _page_aligned(numel: int, dtype: torch.dtype) -> torch.Tensor:
    """numel elements of pageable memory starting on a page boundary (torch.empty: untouched)."""
    spare = PAGE_BYTES // dtype.itemsize
    raw = torch.empty(numel + spare, dtype=dtype)
    skip = (-raw.data_ptr() % PAGE_BYTES) // dtype.itemsize
    return raw.narrow(0, skip, numel)
