"""Block copies between KV layers on a device and host layers through reused device buffers.

On CUDA a copy that needs reordering (scattered block ids, or a layout whose blocks are not
contiguous) gathers on the device first, then crosses the bus as one dense transfer. Torch
would allocate that temporary on every call, on the copy stream, out of memory vLLM did not
profile. Here it is a buffer allocated once per copy stream and used in chunks. The
functions are device-agnostic, so CPU tests check the same code byte for byte.
"""

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from kvscope.connector.common.block_copy import CopyRun
from kvscope.connector.common.host_buffer import BlockLayout

STAGING_BYTES = 16 * 2**20
"""Device memory per copy stream for gathers; a longer run is copied in chunks."""


@dataclass
class Staging:
    """Device memory one copy stream reuses for every job; only that stream may touch it."""

    blocks: torch.Tensor = field(
        repr=False
    )  # [capacity, *layer_block_shape]: one layer's blocks of a chunk
    block_ids: torch.Tensor = field(
        repr=False
    )  # int64 [num_device_blocks]: a job's device ids, uploaded once

    @classmethod
    def allocate(
        cls, layout: BlockLayout, device: torch.device, staging_bytes: int = STAGING_BYTES
    ) -> "Staging":
        capacity = max(
            1, min(layout.num_device_blocks, staging_bytes // layout.bytes_per_layer_block)
        )
        return cls(
            blocks=torch.empty((capacity, *layout.layer_block_shape), dtype=layout.dtype,
                               device=device),
            block_ids=torch.empty(layout.num_device_blocks, dtype=torch.int64, device=device),
        )  # fmt: skip

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
) -> None:
    """Device -> host for every layer of every run; no allocation on the device."""
    device_ids = staging.upload_ids(runs)
    for device_layer, host_layer in zip(device_layers, host_layers, strict=True):
        blocks_first = device_layer.movedim(block_dim, 0)
        for run, ids in zip(runs, device_ids, strict=True):
            for offset, count in _chunks(run, staging.capacity):
                host_range = host_layer.narrow(0, run.host_start + offset, count)
                if run.device_start is not None:
                    source = blocks_first.narrow(0, run.device_start + offset, count)
                    if source.is_contiguous():  # straight over the bus
                        host_range.copy_(source, non_blocking=True)
                        continue
                    gathered = staging.blocks[:count]
                    gathered.copy_(source)
                else:
                    gathered = staging.blocks[:count]
                    torch.index_select(blocks_first, 0, ids[offset : offset + count], out=gathered)
                host_range.copy_(gathered, non_blocking=True)


def staged_load(
    device_layers: Sequence[torch.Tensor],
    host_layers: Sequence[torch.Tensor],
    block_dim: int,
    runs: Sequence[CopyRun],
    staging: Staging,
) -> None:
    """Host -> device for every layer of every run; no allocation on the device."""
    device_ids = staging.upload_ids(runs)
    for device_layer, host_layer in zip(device_layers, host_layers, strict=True):
        blocks_first = device_layer.movedim(block_dim, 0)  # a view: writes land in the layer
        for run, ids in zip(runs, device_ids, strict=True):
            for offset, count in _chunks(run, staging.capacity):
                host_range = host_layer.narrow(0, run.host_start + offset, count)
                if run.device_start is not None:
                    target = blocks_first.narrow(0, run.device_start + offset, count)
                    if target.is_contiguous():
                        target.copy_(host_range, non_blocking=True)
                        continue
                    staging.blocks[:count].copy_(host_range, non_blocking=True)
                    target.copy_(staging.blocks[:count])
                else:
                    staging.blocks[:count].copy_(host_range, non_blocking=True)
                    blocks_first.index_copy_(
                        0, ids[offset : offset + count], staging.blocks[:count]
                    )


def _chunks(run: CopyRun, capacity: int) -> list[tuple[int, int]]:
    """(offset, count) pieces of a run that fit the staging buffer."""
    return [
        (offset, min(capacity, run.num_blocks - offset))
        for offset in range(0, run.num_blocks, capacity)
    ]
