"""Kernel-block KV views regrouped into whole KV blocks, as vLLM's own offloader regroups them."""

from collections.abc import Sequence

import torch


def kernel_blocks_per_block(view: torch.Tensor, num_blocks: int) -> int:
    """How many kernel blocks one KV block of this vLLM view holds (1: no splitting).

    vLLM hands connectors 4-D `[B, H, N, C]` views whose B counts kernel blocks when the
    attention backend's kernel block is smaller than the KV block (FlashInfer on Hopper takes
    16/32/64 tokens, FlashMLA 64, CUTLASS MLA 128): then B is num_blocks times the ratio.
    """
    if view.dim() != 4 or num_blocks <= 0 or view.shape[0] <= num_blocks:
        return 1  # whole blocks, or not one of vLLM 0.32's views: the caller finds the blocks
    rows = view.shape[0]
    if rows % num_blocks:
        raise ValueError(
            f"a KV view of {rows} rows does not split into {num_blocks} KV blocks: register "
            "the views vLLM allocated for this KV cache config"
        )
    return rows // num_blocks


def group_kernel_blocks(view: torch.Tensor, num_blocks: int) -> torch.Tensor:
    """The view as `[num_blocks, ratio, H, N, C]` (a view of the same memory), or itself when
    its blocks are whole. A KV block's kernel blocks sit one kernel-block stride apart (vLLM
    splits only dense pages), so this is `vllm.v1.kv_cache_interface.group_kernel_blocks`."""
    if kernel_blocks_per_block(view, num_blocks) == 1:
        return view
    return view.unflatten(0, (num_blocks, -1))


def group_layers(layers: Sequence[torch.Tensor], num_blocks: int) -> list[torch.Tensor] | None:
    """Every layer regrouped into whole KV blocks (block dim 0), or None when vLLM did not
    split the blocks (then the views are used as they are)."""
    if not layers or kernel_blocks_per_block(layers[0], num_blocks) == 1:
        return None
    return [group_kernel_blocks(layer, num_blocks) for layer in layers]
