"""Block copies between KV layers on a device and host layers through reused device buffers."""

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

import torch

from kvscope.connector.cpu_offload.copy.plan import CopyRun

STAGING_BYTES: Final = 16 * 2**20
"""Device memory per copy stream for gathers; a longer run is copied in chunks."""


@dataclass
class Staging:
    """Device memory one copy stream reuses for every job; only that stream may touch it.

    A run that is one dense range on both sides crosses the bus as one copy, with no kernel. A run
    that needs reordering (scattered block ids, or blocks that are not dense on the device) is
    gathered on the device first, then crosses the bus as one dense transfer. Torch would allocate
    that temporary on every call, on the copy stream, out of memory vLLM did not profile. Here it is
    a buffer allocated once per copy stream and used in chunks. This module's functions are
    device-agnostic, so CPU tests check the same code byte for byte.
    """

    # [capacity, *block_shape]: one table's blocks of a chunk, as the host holds them
    blocks: torch.Tensor = field(repr=False)
    # int64 [num_device_blocks]: a job's device ids, uploaded once
    block_ids: torch.Tensor = field(repr=False)

    @classmethod
    def allocate(
        cls,
        host_table: torch.Tensor,
        num_device_blocks: int,
        device: torch.device,
        staging_bytes: int = STAGING_BYTES,
    ) -> "Staging":
        """Staging shaped and strided like one block of host_table (a host layer or row table)."""
        block = host_table[0]
        block_bytes = max(1, block.numel() * block.element_size())
        capacity = max(1, min(num_device_blocks, staging_bytes // block_bytes))
        blocks = torch.empty((capacity, *block.shape), dtype=block.dtype, device=device).as_strided(
            (capacity, *block.shape), (block.numel(), *block.stride())
        )
        block_ids = torch.empty(num_device_blocks, dtype=torch.int64, device=device)
        return cls(blocks=blocks, block_ids=block_ids)

    @property
    def capacity(self) -> int:
        return self.blocks.shape[0]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.blocks, self.block_ids))

    def upload_ids(self, runs: Sequence[CopyRun]) -> list[torch.Tensor | None]:
        """The device ids of each scattered run, as slices of block_ids, in one transfer.

        From pinned memory the transfer is asynchronous; torch's pinned allocator keeps that
        memory from reuse until the copy stream has read it. Slice runs need no ids (None).
        """
        scattered = [run.device_block_ids for run in runs if run.device_start is None]
        if not scattered:
            return [None] * len(runs)
        host_ids = torch.cat(scattered)
        if self.block_ids.is_cuda:
            host_ids = host_ids.pin_memory()
        self.block_ids[: len(host_ids)].copy_(host_ids, non_blocking=True)
        slices: list[torch.Tensor | None] = []
        start = 0
        for run in runs:
            if run.device_start is not None:
                slices.append(None)
                continue
            slices.append(self.block_ids[start : start + run.num_blocks])
            start += run.num_blocks
        return slices


def staged_store(
    device_layers: Sequence[torch.Tensor],
    host_layers: Sequence[torch.Tensor],
    block_dim: int,
    runs: Sequence[CopyRun],
    staging: Staging,
) -> int:
    """Device -> host for every layer of every run; returns the copies (and gathers) queued."""
    device_ids = staging.upload_ids(runs)
    copies = int(any(ids is not None for ids in device_ids))
    for device_layer, host_layer in zip(device_layers, host_layers, strict=True):
        blocks_first = device_layer.movedim(block_dim, 0)
        for run, ids in zip(runs, device_ids, strict=True):
            if run.device_start is not None:
                source = blocks_first.narrow(0, run.device_start, run.num_blocks)
                host_range = host_layer.narrow(0, run.host_start, run.num_blocks)
                if _same_dense_range(source, host_range):  # straight over the bus
                    host_range.copy_(source, non_blocking=True)
                    copies += 1
                    continue
            for offset, count in _chunks(run, staging.capacity):
                gathered = staging.blocks[:count]
                if ids is None:
                    gathered.copy_(blocks_first.narrow(0, run.device_start + offset, count))
                else:
                    torch.index_select(blocks_first, 0, ids[offset : offset + count], out=gathered)
                host_layer.narrow(0, run.host_start + offset, count).copy_(
                    gathered, non_blocking=True
                )
                copies += 2
    return copies


def staged_load(
    device_layers: Sequence[torch.Tensor],
    host_layers: Sequence[torch.Tensor],
    block_dim: int,
    runs: Sequence[CopyRun],
    staging: Staging,
) -> int:
    """Host -> device for every layer of every run; returns the copies (and scatters) queued."""
    device_ids = staging.upload_ids(runs)
    copies = int(any(ids is not None for ids in device_ids))
    for device_layer, host_layer in zip(device_layers, host_layers, strict=True):
        blocks_first = device_layer.movedim(block_dim, 0)  # a view: writes land in the layer
        for run, ids in zip(runs, device_ids, strict=True):
            if run.device_start is not None:
                target = blocks_first.narrow(0, run.device_start, run.num_blocks)
                host_range = host_layer.narrow(0, run.host_start, run.num_blocks)
                if _same_dense_range(target, host_range):
                    target.copy_(host_range, non_blocking=True)
                    copies += 1
                    continue
            for offset, count in _chunks(run, staging.capacity):
                landed = staging.blocks[:count]
                landed.copy_(
                    host_layer.narrow(0, run.host_start + offset, count), non_blocking=True
                )
                if ids is None:
                    blocks_first.narrow(0, run.device_start + offset, count).copy_(landed)
                else:
                    blocks_first.index_copy_(0, ids[offset : offset + count], landed)
                copies += 2
    return copies


def _same_dense_range(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Both are one dense range with the same element order: one memcpy moves a run."""
    return a.is_contiguous() and b.is_contiguous()


def _chunks(run: CopyRun, capacity: int) -> list[tuple[int, int]]:
    """(offset, count) pieces of a run that fit the staging buffer."""
    return [
        (offset, min(capacity, run.num_blocks - offset))
        for offset in range(0, run.num_blocks, capacity)
    ]
