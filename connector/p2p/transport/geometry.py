"""vLLM's KV cache layouts in bytes: which runs of memory hold a block, read from the views."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import torch

from kvscope.connector.common.kv_layout import KV_CACHE_LAYOUTS, KVLayoutError, layout_name

LAYOUT_ENV: Final = "VLLM_KV_CACHE_LAYOUT"
"""The variable that makes vLLM resolve one layout for the engine."""
RUN_LAYOUTS: Final = ("LBHNC", "LBNHC", "BLHNC", "BLNHC")
"""Layouts whose blocks are one run per layer (and, for BL*, one run across all layers)."""


@dataclass(frozen=True)
class KVCacheGeometry:
    """Where each block of each layer lives, in bytes.

    Layer `l`'s page of block `b` (its [H, N, C] cells) starts at
    `layer_base_addrs[l] + b * block_stride_bytes`. When `page_runs`, that page is one run of
    `page_bytes`. When `block_runs`, block `b` of every layer together is one run of
    `num_layers * page_bytes` starting at `min(layer_base_addrs) + b * block_stride_bytes`.
    """

    layout: str
    num_blocks: int
    page_bytes: int
    block_stride_bytes: int
    layer_base_addrs: tuple[int, ...]
    page_runs: bool
    block_runs: bool

    @property
    def num_layers(self) -> int:
        return len(self.layer_base_addrs)

    @property
    def page_order(self) -> str:
        """The order of a page's cells in memory, e.g. 'HNC' (heads outer) or 'NHC'."""
        return self.layout.replace("L", "").replace("B", "")

    @property
    def block_order(self) -> str:
        """The order of a whole block's cells across layers in memory, e.g. 'LNHC'."""
        return self.layout.replace("B", "")

    def unit_bytes(self, per_block: bool) -> int:
        return self.num_layers * self.page_bytes if per_block else self.page_bytes

    def descriptors(self, per_block: bool, device_id: int = 0) -> np.ndarray:
        """(addr, len, device) rows: one per block if per_block, else one per (layer, block),
        layer-major (row `l * num_blocks + b`)."""
        if per_block and not self.block_runs or not per_block and not self.page_runs:
            unit = "block" if per_block else "layer page"
            raise KVLayoutError(f"layout {self.layout}: a {unit} is not one run of bytes")
        bases = [min(self.layer_base_addrs)] if per_block else list(self.layer_base_addrs)
        stride = np.uint64(self.block_stride_bytes)
        offsets = np.arange(self.num_blocks, dtype=np.uint64)[None, :] * stride
        descs = np.empty((len(bases) * self.num_blocks, 3), dtype=np.uint64)
        descs[:, 0] = (np.asarray(bases, dtype=np.uint64)[:, None] + offsets).ravel()
        descs[:, 1] = self.unit_bytes(per_block)
        descs[:, 2] = device_id
        return descs

    def registration_regions(self) -> list[tuple[int, int]]:
        """Disjoint (addr, length) spans covering every block of every layer."""
        span = (self.num_blocks - 1) * self.block_stride_bytes
        if self.block_runs:
            return [(min(self.layer_base_addrs), span + self.num_layers * self.page_bytes)]
        merged: list[tuple[int, int]] = []
        for start in sorted(self.layer_base_addrs):
            end = start + span + self.page_bytes
            if merged and start <= sum(merged[-1]):
                first = merged[-1][0]
                merged[-1] = (first, max(sum(merged[-1]), end) - first)
            else:
                merged.append((start, end - start))
        return merged


def describe_kv_views(
    views: list[torch.Tensor],
    layout: Any,
    num_blocks: int | None = None,
    tensor_strides: tuple[int, int] | None = None,
) -> KVCacheGeometry:
    """Describe vLLM's per-layer 4-D `[B, H, N, C]` views (in layer order) of one layout.

    `layout` is the engine's resolved layout; the views' strides must agree with it.
    `num_blocks` is the manager's block count when the views hold smaller kernel blocks;
    `tensor_strides` is the `KVCacheTensor`'s (layer_stride, block_stride) in bytes, checked.
    """
    name = layout_name(layout)
    first = _check_alike(views)
    es = first.element_size()
    dims = [(size, stride * es) for size, stride in zip(first.shape, first.stride(), strict=True)]
    _check_order(dims, name)
    (blocks, block_stride), cells = _group_blocks(dims, num_blocks)
    bases = tuple(v.data_ptr() for v in views)
    layer_strides = {b - a for a, b in zip(bases, bases[1:], strict=False)}
    page_runs = _dense(cells, es)
    block_runs = len(layer_strides) <= 1 and _dense(
        cells + [(len(views), next(iter(layer_strides), 0))], es
    )
    if not page_runs and not block_runs:
        raise KVLayoutError(
            f"KV cache layout {name}: a block's bytes are neither one run per layer nor one run"
            f" across layers; set {LAYOUT_ENV} to one of {', '.join(RUN_LAYOUTS)}"
            " (the same on both engines)"
        )
    if tensor_strides is not None:
        _check_tensor_strides(name, tensor_strides, layer_strides, block_stride, len(views))
    page_bytes = es * int(np.prod([size for size, _ in cells]))
    return KVCacheGeometry(name, blocks, page_bytes, block_stride, bases, page_runs, block_runs)


def _check_alike(views: list[torch.Tensor]) -> torch.Tensor:
    if not views:
        raise KVLayoutError("no KV cache layers given: register the engine's KV caches first")
    first = views[0]
    if first.dim() != 4:
        raise KVLayoutError(
            f"KV cache view of shape {tuple(first.shape)}: expected vLLM's 4-D per-layer"
            " views [num_blocks, num_kv_heads, block_size, content]"
        )
    for view in views[1:]:
        alike = (view.shape, view.stride(), view.dtype, view.device)
        if alike != (first.shape, first.stride(), first.dtype, first.device):
            raise KVLayoutError(
                f"a KV layer is {tuple(view.shape)} {view.stride()} {view.dtype} on"
                f" {view.device}, the first {tuple(first.shape)} {first.stride()} {first.dtype}"
                f" on {first.device}: all layers of one KV cache tensor must match"
            )
    return first


def _check_order(dims: list[tuple[int, int]], name: str) -> None:
    """The view's axes, largest stride first, must come in the layout's physical order."""
    expected = [axis for axis in name if axis != "L"]
    sized = [(stride, axis) for axis, (size, stride) in zip("BHNC", dims, strict=True) if size > 1]
    seen = [axis for _, axis in sorted(sized, key=lambda s: -s[0])]
    if seen != [axis for axis in expected if axis in seen]:
        raise KVLayoutError(
            f"the KV views are laid out as {''.join(seen)} (largest stride first), not as"
            f" {name}: describe them with the layout vLLM resolved for this engine"
        )


def _group_blocks(
    dims: list[tuple[int, int]], num_blocks: int | None
) -> tuple[tuple[int, int], list[tuple[int, int]]]:
    """(manager blocks, their byte stride) and a block's cell dims, kernel blocks folded in."""
    (blocks, stride), cells = dims[0], dims[1:]
    if num_blocks is None or num_blocks == blocks:
        return (blocks, stride), cells
    if num_blocks <= 0 or blocks % num_blocks:
        raise KVLayoutError(f"{blocks} kernel blocks do not split into {num_blocks} blocks")
    ratio = blocks // num_blocks
    return (num_blocks, stride * ratio), [(ratio, stride), *cells]


def _dense(dims: list[tuple[int, int]], element_size: int) -> bool:
    """True when these (size, byte stride) dims tile one run of bytes without gaps."""
    expected = element_size
    for size, stride in sorted((d for d in dims if d[0] > 1), key=lambda d: d[1]):
        if stride != expected:
            return False
        expected *= size
    return True


def _check_tensor_strides(
    name: str,
    tensor_strides: tuple[int, int],
    layer_strides: set[int],
    block_stride: int,
    num_layers: int,
) -> None:
    layer_stride, vllm_block_stride = tensor_strides
    if vllm_block_stride != block_stride or (num_layers > 1 and layer_strides != {layer_stride}):
        raise KVLayoutError(
            f"layout {name}: the views' strides (layer {sorted(layer_strides)}, block"
            f" {block_stride}) differ from vLLM's KVCacheTensor (layer {layer_stride}, block"
            f" {vllm_block_stride}): pass the views vLLM allocated for that tensor"
        )


def _layer_stride(views: list[torch.Tensor]) -> float:
    """Elements from one layer's view to the next's when the layers share one allocation at one
    stride; otherwise each layer has memory of its own (the layer axis is outermost), in
    whatever address order the allocator placed them."""
    starts = [view.data_ptr() for view in views]
    gaps = {later - earlier for earlier, later in itertools.pairwise(starts)}
    if len(gaps) == 1 and (gap := gaps.pop()) > 0:
        return gap // views[0].element_size()
    return math.inf


def identify_layout(views: list[torch.Tensor]) -> str:
    """The layout whose physical order the views' strides show (for callers without vLLM's
    resolved layout, e.g. tools over a saved cache); prefer the engine's own when it has one."""
    first = _check_alike(views)
    strides = dict(zip("BHNC", first.stride(), strict=True))
    sized = {axis for axis, size in zip("BHNC", first.shape, strict=True) if size > 1}
    if len(views) > 1:
        strides["L"] = _layer_stride(views)
        sized.add("L")
    seen = [axis for axis in sorted(sized, key=lambda a: -strides[a])]
    for name in KV_CACHE_LAYOUTS:
        if [axis for axis in name if axis in sized] == seen:
            return name
    raise KVLayoutError(
        f"the KV views' axes, largest stride first, are {''.join(seen)}:"
        f" none of vLLM's layouts {KV_CACHE_LAYOUTS}"
    )
