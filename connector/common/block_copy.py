"""Copies runs of whole blocks between per-layer KV tensors and host layers, batched per run."""

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class CopyRun:
    """Blocks that land on consecutive host block ids, with their device block ids."""

    host_start: int
    num_blocks: int
    device_start: int | None  # set when the device ids are consecutive too: a plain slice copy
    device_block_ids: torch.Tensor  # int64, same length; moved to the KV device before use


def plan_runs(
    device_block_ids: Sequence[int],
    host_block_ids: Sequence[int],
    num_device_blocks: int,
    num_host_blocks: int,
) -> list[CopyRun]:
    """Groups (device, host) pairs into host-contiguous runs; raises on bad or repeated ids.

    Vectorised in numpy, because a job of a thousand small blocks must not spend longer
    planning than copying, and a job of a few large ones must not spend 100 us on torch's
    per-operation overhead (a numpy operation costs about a microsecond here, a torch one 5).
    """
    device_ids = _checked_ids("device", device_block_ids, num_device_blocks)
    host_ids = _checked_ids("host", host_block_ids, num_host_blocks)
    if len(device_ids) != len(host_ids):
        raise ValueError(f"{len(device_ids)} device blocks but {len(host_ids)} host blocks")
    if len(host_ids) == 0:
        return []
    if not _is_sorted(host_ids):
        order = np.argsort(host_ids, kind="stable")
        host_ids, device_ids = host_ids[order], device_ids[order]
    device_tensor = torch.from_numpy(device_ids)
    device_steps_off = np.diff(device_ids) != 1
    host_breaks = np.flatnonzero(np.diff(host_ids) != 1) + 1
    if len(host_breaks) == 0:  # the usual job: one host range
        consecutive = not device_steps_off.any()
        device_start = int(device_ids[0]) if consecutive else None
        return [CopyRun(int(host_ids[0]), len(host_ids), device_start, device_tensor)]
    starts = np.concatenate(([0], host_breaks))
    ends = np.concatenate((host_breaks, [len(host_ids)]))
    # device_gaps[i]: how many device-id steps up to position i are not +1.
    device_gaps = np.concatenate(([0], device_steps_off.cumsum()))
    consecutive = device_gaps[ends - 1] == device_gaps[starts]
    columns = (starts, ends, host_ids[starts], device_ids[starts], consecutive)
    return [
        CopyRun(
            host_start=host_start,
            num_blocks=end - start,
            device_start=device_start if is_consecutive else None,
            device_block_ids=device_tensor[start:end],
        )
        for start, end, host_start, device_start, is_consecutive in zip(
            *(column.tolist() for column in columns), strict=True
        )
    ]


def _is_sorted(ids: np.ndarray) -> bool:
    return len(ids) < 2 or bool((ids[1:] > ids[:-1]).all())


def _checked_ids(side: str, block_ids: Sequence[int], limit: int) -> np.ndarray:
    if isinstance(block_ids, torch.Tensor):
        ids = block_ids.to("cpu", torch.int64).flatten().numpy().copy()  # never the caller's
    elif len(block_ids) == 0:
        return np.empty(0, dtype=np.int64)
    else:
        ids = np.array(block_ids, dtype=np.int64).reshape(-1)
    if len(ids) == 0:
        return ids
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high >= limit:
        bad = low if low < 0 else high
        raise ValueError(f"{side} block id {bad} out of range [0, {limit})")
    if len(ids) > 1 and not _is_sorted(ids) and len(np.unique(ids)) != len(ids):
        raise ValueError(f"repeated {side} block ids in one copy job: {ids.tolist()}")
    return ids


# Widest first. CPU index kernels move one element at a time, so viewing bf16 KV as 16-byte
# elements makes scattered copies about as fast as a memcpy; moves never alter bits. Slice
# copies stay in the original dtype: their memcpy path is faster than a complex128 copy.
_WIDE_DTYPES = (torch.complex128, torch.int64, torch.int32)


def widest_views(
    device_layer: torch.Tensor, host_layer: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Both layers reinterpreted as the widest dtype their innermost contiguous axis allows."""
    if device_layer.device.type != "cpu":
        return device_layer, host_layer
    for wide_dtype in _WIDE_DTYPES:
        if _can_view_as(device_layer, wide_dtype) and _can_view_as(host_layer, wide_dtype):
            return device_layer.view(wide_dtype), host_layer.view(wide_dtype)
    return device_layer, host_layer


def _can_view_as(tensor: torch.Tensor, wide_dtype: torch.dtype) -> bool:
    wide_size, item_size = wide_dtype.itemsize, tensor.element_size()
    return (
        tensor.dim() > 0
        and tensor.stride(-1) == 1
        and wide_size > item_size
        and (tensor.shape[-1] * item_size) % wide_size == 0
        and (tensor.storage_offset() * item_size) % wide_size == 0
        and all(stride * item_size % wide_size == 0 for stride in tensor.stride()[:-1])
    )


def store_runs(
    device_layers: Sequence[torch.Tensor],
    host_layers: Sequence[torch.Tensor],
    block_dim: int,
    runs: Sequence[CopyRun],
    non_blocking: bool = False,
) -> None:
    """Device -> host, every layer of every run."""
    any_indexed = any(run.device_start is None for run in runs)
    for device_layer, host_layer in zip(device_layers, host_layers, strict=True):
        if any_indexed:
            wide_device_layer, wide_host_layer = widest_views(device_layer, host_layer)
        for run in runs:
            if run.device_start is None:
                _store_indexed(wide_device_layer, wide_host_layer, block_dim, run, non_blocking)
            else:
                _store_slice(device_layer, host_layer, block_dim, run, non_blocking)


def load_runs(
    device_layers: Sequence[torch.Tensor],
    host_layers: Sequence[torch.Tensor],
    block_dim: int,
    runs: Sequence[CopyRun],
    non_blocking: bool = False,
) -> None:
    """Host -> device, every layer of every run."""
    any_indexed = any(run.device_start is None for run in runs)
    for device_layer, host_layer in zip(device_layers, host_layers, strict=True):
        if any_indexed:
            wide_device_layer, wide_host_layer = widest_views(device_layer, host_layer)
        for run in runs:
            if run.device_start is None:
                _load_indexed(wide_device_layer, wide_host_layer, block_dim, run, non_blocking)
            else:
                _load_slice(device_layer, host_layer, block_dim, run, non_blocking)


def _store_slice(
    device_layer: torch.Tensor,
    host_layer: torch.Tensor,
    block_dim: int,
    run: CopyRun,
    non_blocking: bool,
) -> None:
    source = device_layer.narrow(block_dim, run.device_start, run.num_blocks)
    _copy_to_host(source.movedim(block_dim, 0), host_layer, run, non_blocking)


def _store_indexed(
    device_layer: torch.Tensor,
    host_layer: torch.Tensor,
    block_dim: int,
    run: CopyRun,
    non_blocking: bool,
) -> None:
    if device_layer.device == host_layer.device:
        # Gather straight into the host range: one pass over the bytes, no temporary.
        host_view = host_layer.narrow(0, run.host_start, run.num_blocks)
        torch.index_select(
            device_layer, block_dim, run.device_block_ids, out=host_view.movedim(0, block_dim)
        )
        return
    source = device_layer.index_select(block_dim, run.device_block_ids)
    _copy_to_host(source.movedim(block_dim, 0), host_layer, run, non_blocking)


def _copy_to_host(
    source: torch.Tensor, host_layer: torch.Tensor, run: CopyRun, non_blocking: bool
) -> None:
    if source.device != host_layer.device:
        # One dense transfer over the bus; any reordering happens on the device side.
        source = source.contiguous()
    host_layer.narrow(0, run.host_start, run.num_blocks).copy_(source, non_blocking=non_blocking)


def _load_slice(
    device_layer: torch.Tensor,
    host_layer: torch.Tensor,
    block_dim: int,
    run: CopyRun,
    non_blocking: bool,
) -> None:
    source = _host_source(device_layer, host_layer, block_dim, run, non_blocking)
    device_layer.narrow(block_dim, run.device_start, run.num_blocks).copy_(source)


def _load_indexed(
    device_layer: torch.Tensor,
    host_layer: torch.Tensor,
    block_dim: int,
    run: CopyRun,
    non_blocking: bool,
) -> None:
    source = _host_source(device_layer, host_layer, block_dim, run, non_blocking)
    device_layer.index_copy_(block_dim, run.device_block_ids, source)


def _host_source(
    device_layer: torch.Tensor,
    host_layer: torch.Tensor,
    block_dim: int,
    run: CopyRun,
    non_blocking: bool,
) -> torch.Tensor:
    """The run's host blocks on the KV device, block axis moved to where the KV has it."""
    source = host_layer.narrow(0, run.host_start, run.num_blocks)
    if source.device != device_layer.device:
        source = source.to(device_layer.device, non_blocking=non_blocking)
    return source.movedim(0, block_dim)
