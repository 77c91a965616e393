"""Copies runs of whole blocks between per-layer KV tensors and host layers, batched per run."""

from collections.abc import Sequence
from dataclasses import dataclass

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
    """Groups (device, host) pairs into host-contiguous runs; raises on bad or repeated ids."""
    _check_ids("device", device_block_ids, num_device_blocks)
    _check_ids("host", host_block_ids, num_host_blocks)
    if len(device_block_ids) != len(host_block_ids):
        raise ValueError(
            f"{len(device_block_ids)} device blocks but {len(host_block_ids)} host blocks"
        )
    pairs = sorted(zip(host_block_ids, device_block_ids, strict=True))
    runs: list[CopyRun] = []
    start = 0
    for end in range(1, len(pairs) + 1):
        if end == len(pairs) or pairs[end][0] != pairs[end - 1][0] + 1:
            runs.append(_make_run(pairs[start:end]))
            start = end
    return runs


# Widest first. CPU index kernels move one element at a time, so viewing bf16 KV as 16-byte
# elements makes scattered copies about as fast as a memcpy; moves never alter bits.
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
    wide_size = torch.empty((), dtype=wide_dtype).element_size()
    item_size = tensor.element_size()
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
    for device_layer, host_layer in zip(device_layers, host_layers, strict=True):
        device_layer, host_layer = widest_views(device_layer, host_layer)
        for run in runs:
            _store_run(device_layer, host_layer, block_dim, run, non_blocking)


def load_runs(
    device_layers: Sequence[torch.Tensor],
    host_layers: Sequence[torch.Tensor],
    block_dim: int,
    runs: Sequence[CopyRun],
    non_blocking: bool = False,
) -> None:
    """Host -> device, every layer of every run."""
    for device_layer, host_layer in zip(device_layers, host_layers, strict=True):
        device_layer, host_layer = widest_views(device_layer, host_layer)
        for run in runs:
            _load_run(device_layer, host_layer, block_dim, run, non_blocking)


def _store_run(
    device_layer: torch.Tensor,
    host_layer: torch.Tensor,
    block_dim: int,
    run: CopyRun,
    non_blocking: bool,
) -> None:
    host_view = host_layer.narrow(0, run.host_start, run.num_blocks)
    if run.device_start is not None:
        source = device_layer.narrow(block_dim, run.device_start, run.num_blocks)
    elif device_layer.device == host_layer.device:
        # Gather straight into the host range: one pass over the bytes, no temporary.
        torch.index_select(
            device_layer, block_dim, run.device_block_ids, out=host_view.movedim(0, block_dim)
        )
        return
    else:
        source = device_layer.index_select(block_dim, run.device_block_ids)
    source = source.movedim(block_dim, 0)
    if source.device != host_view.device:
        # One dense transfer over the bus; the reordering happens on the device side.
        source = source.contiguous()
    host_view.copy_(source, non_blocking=non_blocking)


def _load_run(
    device_layer: torch.Tensor,
    host_layer: torch.Tensor,
    block_dim: int,
    run: CopyRun,
    non_blocking: bool,
) -> None:
    source = host_layer.narrow(0, run.host_start, run.num_blocks)
    if source.device != device_layer.device:
        source = source.to(device_layer.device, non_blocking=non_blocking)
    source = source.movedim(0, block_dim)
    if run.device_start is not None:
        target = device_layer.narrow(block_dim, run.device_start, run.num_blocks)
        target.copy_(source)
    else:
        device_layer.index_copy_(block_dim, run.device_block_ids, source)


def _make_run(pairs: list[tuple[int, int]]) -> CopyRun:
    device_ids = [device_id for _, device_id in pairs]
    consecutive = all(b == a + 1 for a, b in zip(device_ids, device_ids[1:], strict=False))
    return CopyRun(
        host_start=pairs[0][0],
        num_blocks=len(pairs),
        device_start=device_ids[0] if consecutive else None,
        device_block_ids=torch.tensor(device_ids, dtype=torch.int64),
    )


def _check_ids(side: str, block_ids: Sequence[int], limit: int) -> None:
    if len(set(block_ids)) != len(block_ids):
        raise ValueError(f"repeated {side} block ids in one copy job: {list(block_ids)}")
    for block_id in block_ids:
        if not 0 <= block_id < limit:
            raise ValueError(f"{side} block id {block_id} out of range [0, {limit})")
