"""One side's KV cache layout in bytes, its wire form, and whether two sides can trade blocks."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Final

import numpy as np
import torch

from kvscope.connector.common.kv_layout import KV_CACHE_LAYOUTS, KVLayoutError
from kvscope.connector.p2p.transport.geometry import (
    LAYOUT_ENV,
    KVCacheGeometry,
    describe_kv_views,
    identify_layout,
)

MAX_WIRE_LAYERS: Final = 4096
"""Bound on layers accepted from a peer, so a hostile layout cannot make us allocate without end."""
MAX_WIRE_DESCRIPTORS: Final = 2**25
"""Bound on a peer's layers x blocks: the descriptors we build for it."""


class LayoutMismatchError(ValueError):
    """Two sides' KV layouts cannot trade blocks; the message says what differs and what to do."""


@dataclass(frozen=True)
class KVLayout:
    """Where every block of every layer lives in one process's memory, and what a block holds.

    `kv_layout` is vLLM's resolved layout name (e.g. 'LBHNC'). Layer `l`'s page of block `b`
    starts at `layer_base_addrs[l] + b * block_stride_bytes`; `page_runs` says that page is
    one run of `page_bytes`, `block_runs` that a block of all layers is one run.
    """

    engine_id: str
    tp_rank: int
    tp_size: int
    layer_names: list[str]
    num_blocks: int
    block_size: int  # tokens per block
    num_kv_heads: int
    head_dim: int
    dtype: str
    kv_layout: str
    memory_kind: str  # "DRAM" or "VRAM"
    device_id: int
    page_bytes: int
    block_stride_bytes: int
    layer_base_addrs: list[int]
    page_runs: bool
    block_runs: bool

    @property
    def num_layers(self) -> int:
        return len(self.layer_names)

    @property
    def bytes_per_block(self) -> int:
        """Bytes one block occupies across all layers: what a one-block read moves."""
        return self.num_layers * self.page_bytes

    @property
    def geometry(self) -> KVCacheGeometry:
        return KVCacheGeometry(
            self.kv_layout,
            self.num_blocks,
            self.page_bytes,
            self.block_stride_bytes,
            tuple(self.layer_base_addrs),
            self.page_runs,
            self.block_runs,
        )

    @classmethod
    def from_layer_tensors(
        cls,
        engine_id: str,
        kv_caches: dict[str, torch.Tensor],
        tp_rank: int = 0,
        tp_size: int = 1,
        kv_layout: Any = None,
        num_blocks: int | None = None,
        tensor_strides: tuple[int, int] | None = None,
    ) -> KVLayout:
        """Describe the KV cache an engine registered (layer name -> vLLM's 4-D view).

        `kv_layout` is the layout vLLM resolved (a `KVCacheLayout` or its name); without it
        the views' strides name it. `num_blocks` and `tensor_strides` as in describe_kv_views.
        """
        views = list(kv_caches.values())
        if kv_layout is None:
            kv_layout = identify_layout(views)
        geometry = describe_kv_views(views, kv_layout, num_blocks, tensor_strides)
        first = views[0]
        _, heads, tokens, content = first.shape
        return cls(
            engine_id=engine_id,
            tp_rank=tp_rank,
            tp_size=tp_size,
            layer_names=list(kv_caches),
            num_blocks=geometry.num_blocks,
            block_size=tokens * first.shape[0] // geometry.num_blocks,
            num_kv_heads=heads,
            head_dim=content // 2,  # keys then values along content
            dtype=str(first.dtype).removeprefix("torch."),
            kv_layout=geometry.layout,
            memory_kind="VRAM" if first.device.type == "cuda" else "DRAM",
            device_id=first.device.index or 0,
            page_bytes=geometry.page_bytes,
            block_stride_bytes=geometry.block_stride_bytes,
            layer_base_addrs=list(geometry.layer_base_addrs),
            page_runs=geometry.page_runs,
            block_runs=geometry.block_runs,
        )

    def descriptor_array(self, per_block: bool) -> np.ndarray:
        """NIXL descriptors (addr, len, device): per block, or per (layer, block) layer-major."""
        return self.geometry.descriptors(per_block, self.device_id)

    def registration_regions(self) -> list[tuple[int, int]]:
        """Disjoint (addr, length) spans covering every block: what to register with NIXL.

        Layers' spans that only touch stay apart: vLLM 0.34's extensible KV cache backs each
        layer's segment with a physical allocation of its own, and one registration may not
        span two (UCX cannot register such a range). Overlapping spans (KV cache groups
        overlaid on one memory) are one region; so is a block-outer cache (one allocation).
        """
        if self.block_runs:
            return self.geometry.registration_regions()
        span = (self.num_blocks - 1) * self.block_stride_bytes + self.page_bytes
        regions: list[tuple[int, int]] = []
        for start in sorted(set(self.layer_base_addrs)):
            if regions and start < sum(regions[-1]):
                first = regions[-1][0]
                regions[-1] = (first, max(sum(regions[-1]), start + span) - first)
            else:
                regions.append((start, span))
        return regions

    def to_wire(self) -> dict[str, Any]:
        """A JSON-able dict; `from_wire` is its strict inverse."""
        return asdict(self)

    @classmethod
    def from_wire(cls, wire: Any) -> KVLayout:
        """Parse a peer's layout, refusing missing, extra or mistyped fields."""
        if not isinstance(wire, dict):
            raise ValueError(f"layout must be a JSON object, got {type(wire).__name__}")
        expected = {f.name: f.type for f in fields(cls)}
        if set(wire) != set(expected):
            missing, extra = set(expected) - set(wire), set(wire) - set(expected)
            raise ValueError(
                f"layout fields differ: missing {sorted(missing)}, extra {sorted(extra)}"
            )
        for name, type_name in expected.items():
            _check_wire_field(name, type_name, wire[name])
        layout = cls(**wire)
        _check_wire_consistent(layout)
        return layout


@dataclass(frozen=True)
class BlockMapping:
    """How local block ids and a peer's block ids turn into NIXL descriptor indices.

    `per_block`: one descriptor per block across all layers (both sides store a block as one
    run, in the same order); else one per (layer, block)."""

    per_block: bool
    num_layers: int
    local_num_blocks: int
    remote_num_blocks: int

    @property
    def descriptors_per_block(self) -> int:
        return 1 if self.per_block else self.num_layers

    def descriptor_ids(
        self, local_block_ids: list[int], remote_block_ids: list[int]
    ) -> tuple[np.ndarray, np.ndarray]:
        """Descriptor indices for the given blocks (every layer), local and remote in step."""
        if len(local_block_ids) != len(remote_block_ids):
            raise ValueError(
                f"{len(local_block_ids)} local block ids for {len(remote_block_ids)} remote ones:"
                " pass one local block per remote block"
            )
        local = _checked_ids(local_block_ids, self.local_num_blocks, "local")
        remote = _checked_ids(remote_block_ids, self.remote_num_blocks, "remote")
        layers = np.arange(self.descriptors_per_block, dtype=np.int64)[:, None]
        local_idx = (layers * self.local_num_blocks + local[None, :]).ravel()
        remote_idx = (layers * self.remote_num_blocks + remote[None, :]).ravel()
        return local_idx.astype(np.int32), remote_idx.astype(np.int32)


def check_compatible(local: KVLayout, remote: KVLayout) -> BlockMapping:
    """The block mapping between two sides, or LayoutMismatchError listing every difference."""
    problems = [
        f"{what}: local {mine!r}, remote {theirs!r} ({fix})"
        for what, mine, theirs, fix in _compared_properties(local, remote)
        if mine != theirs
    ]
    per_block = _per_block(local, remote)
    if per_block is None and not problems:
        problems.append(
            f"kv cache layout: local {local.kv_layout!r}, remote {remote.kv_layout!r} (a block's"
            f" cells are {local.geometry.page_order} on one side and"
            f" {remote.geometry.page_order} on the other: set {LAYOUT_ENV} to the same layout"
            " on both engines)"
        )
    if problems:
        raise LayoutMismatchError(
            f"engine {remote.engine_id!r} (tp rank {remote.tp_rank}) cannot send KV blocks to "
            f"engine {local.engine_id!r}: " + "; ".join(problems)
        )
    return BlockMapping(bool(per_block), local.num_layers, local.num_blocks, remote.num_blocks)


def _per_block(local: KVLayout, remote: KVLayout) -> bool | None:
    """True: trade whole blocks; False: trade layer pages; None: the bytes are ordered apart."""
    mine, theirs = local.geometry, remote.geometry
    if mine.block_runs and theirs.block_runs and mine.block_order == theirs.block_order:
        return True
    if mine.page_runs and theirs.page_runs and mine.page_order == theirs.page_order:
        return False  # e.g. LBHNC and BLHNC: each layer's page is HNC on both sides
    return None


def _compared_properties(local: KVLayout, remote: KVLayout) -> list[tuple[str, Any, Any, str]]:
    same_model = "serve the same model on both sides"
    return [
        (
            "block_size in tokens",
            local.block_size,
            remote.block_size,
            "start both engines with the same --block-size",
        ),
        ("dtype", local.dtype, remote.dtype, "start both engines with the same --kv-cache-dtype"),
        (
            "num_kv_heads",
            local.num_kv_heads,
            remote.num_kv_heads,
            f"{same_model} with the same tensor-parallel size",
        ),
        ("head_dim", local.head_dim, remote.head_dim, same_model),
        ("num layers", local.num_layers, remote.num_layers, same_model),
        ("tp_size", local.tp_size, remote.tp_size, "use the same tensor-parallel size"),
        ("bytes per block per layer", local.page_bytes, remote.page_bytes, same_model),
    ]


def _check_wire_field(name: str, type_name: Any, value: Any) -> None:
    if type_name == "str":
        ok = isinstance(value, str) and len(value) <= 256
    elif type_name == "int":
        ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**64
    elif type_name == "bool":
        ok = isinstance(value, bool)
    elif name == "layer_names":
        ok = isinstance(value, list) and len(value) <= MAX_WIRE_LAYERS
        ok = ok and all(isinstance(v, str) and len(v) <= 256 for v in value)
    else:  # layer_base_addrs
        ok = isinstance(value, list) and len(value) <= MAX_WIRE_LAYERS
        ok = ok and all(isinstance(v, int) and 0 <= v < 2**64 for v in value)
    if not ok:
        raise ValueError(f"layout field {name!r} has a bad value: {str(value)[:80]}")


def _check_wire_consistent(layout: KVLayout) -> None:
    if layout.kv_layout not in KV_CACHE_LAYOUTS:
        raise ValueError(f"layout {layout.kv_layout!r} is none of vLLM's {KV_CACHE_LAYOUTS}")
    if len(layout.layer_base_addrs) != layout.num_layers or not layout.num_layers:
        raise ValueError(
            f"layout has {len(layout.layer_base_addrs)} layer addresses for"
            f" {layout.num_layers} layers"
        )
    if not 0 < layout.num_blocks * layout.num_layers <= MAX_WIRE_DESCRIPTORS:
        raise ValueError(f"layout has {layout.num_blocks} blocks x {layout.num_layers} layers")
    if not (layout.page_runs or layout.block_runs) or not layout.page_bytes:
        raise ValueError(f"layout {layout.kv_layout!r} stores blocks in no run of bytes")
    if layout.memory_kind not in ("DRAM", "VRAM"):
        raise ValueError(f"layout memory kind {layout.memory_kind!r} is neither DRAM nor VRAM")


def _checked_ids(block_ids: list[int], num_blocks: int, side: str) -> np.ndarray:
    ids = np.asarray(block_ids, dtype=np.int64)
    if ids.ndim != 1 or (ids.size and (ids.min() < 0 or ids.max() >= num_blocks)):
        raise ValueError(
            f"{side} block ids must lie in [0, {num_blocks}), got {list(block_ids)[:8]}..."
        )
    return ids


__all__ = ["KVLayout", "KVLayoutError", "BlockMapping", "LayoutMismatchError", "check_compatible"]
