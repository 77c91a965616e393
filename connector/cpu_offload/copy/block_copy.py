"""Copies runs of whole blocks between per-layer KV tensors and host layers, batched per run."""

from collections.abc import Callable, Sequence

import torch

from kvscope.connector.cpu_offload.copy.plan import CopyRun

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
) -> int:
    """Device -> host, every layer of every run; returns the number of copies made."""
    copies = (_store_indexed, _store_slice)
    return _copy_runs(device_layers, host_layers, block_dim, runs, non_blocking, *copies)


def load_runs(
    device_layers: Sequence[torch.Tensor],
    host_layers: Sequence[torch.Tensor],
    block_dim: int,
    runs: Sequence[CopyRun],
    non_blocking: bool = False,
) -> int:
    """Host -> device, every layer of every run; returns the number of copies made."""
    copies = (_load_indexed, _load_slice)
    return _copy_runs(device_layers, host_layers, block_dim, runs, non_blocking, *copies)


def _copy_runs(
    device_layers: Sequence[torch.Tensor],
    host_layers: Sequence[torch.Tensor],
    block_dim: int,
    runs: Sequence[CopyRun],
    non_blocking: bool,
    copy_indexed: Callable[..., None],
    copy_slice: Callable[..., None],
) -> int:
    """Each run of each layer by slice, or by index over the widest views the layers allow."""
    any_indexed = any(run.device_start is None for run in runs)
    for device_layer, host_layer in zip(device_layers, host_layers, strict=True):
        if any_indexed:
            wide_device_layer, wide_host_layer = widest_views(device_layer, host_layer)
        for run in runs:
            if run.device_start is None:
                copy_indexed(wide_device_layer, wide_host_layer, block_dim, run, non_blocking)
            else:
                copy_slice(device_layer, host_layer, block_dim, run, non_blocking)
    return len(device_layers) * len(runs)


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
