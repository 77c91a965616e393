"""One side's KV cache layout in bytes, its wire form, and whether two sides can trade blocks."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any, Final

import numpy as np
import torch

KV_LAYOUT_CPU: Final = "blocks_heads_tokens_kvdim"
"""vLLM's CPU attention: per layer [num_blocks, num_kv_heads, block_size, 2*head_dim]."""
KV_LAYOUT_CUDA: Final = "kv_blocks_tokens_heads_dim"
"""vLLM's CUDA attention: per layer [2, num_blocks, block_size, num_kv_heads, head_dim]."""
MAX_WIRE_LAYERS: Final = 4096
"""Bound on layers accepted from a peer, so a hostile layout cannot make us allocate without end."""

_PLANES_PER_LAYER: Final = {KV_LAYOUT_CPU: 1, KV_LAYOUT_CUDA: 2}


class LayoutMismatchError(ValueError):
    """Two sides' KV layouts cannot trade blocks; the message says what differs and what to do."""


@dataclass(frozen=True)
class KVLayout:
    """Where every block of every layer lives in one process's memory, and what a block holds.

    A layer is stored as `planes_per_layer` planes (1 on CPU: keys and values interleaved;
    2 on CUDA: keys, then values). Within a plane, block `block_id` is one contiguous run of
    `plane_bytes_per_block` bytes at `plane_base_addrs[plane] + block_id * block_stride_bytes`.
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
    planes_per_layer: int
    plane_bytes_per_block: int
    block_stride_bytes: int
    plane_base_addrs: list[int] = field(repr=False)

    @property
    def num_layers(self) -> int:
        return len(self.layer_names)

    @property
    def num_planes(self) -> int:
        return self.num_layers * self.planes_per_layer

    @property
    def bytes_per_block_per_layer(self) -> int:
        return self.planes_per_layer * self.plane_bytes_per_block

    @property
    def bytes_per_block(self) -> int:
        """Bytes one block occupies across all layers: what a one-block read moves."""
        return self.num_layers * self.bytes_per_block_per_layer

    @classmethod
    def from_layer_tensors(
        cls,
        engine_id: str,
        kv_caches: dict[str, torch.Tensor],
        tp_rank: int = 0,
        tp_size: int = 1,
        kv_layout: str | None = None,
    ) -> KVLayout:
        """Describe the KV cache an engine registered (layer name -> tensor, in layer order)."""
        if not kv_caches:
            raise ValueError("no KV cache layers given: register the engine's KV caches first")
        first = next(iter(kv_caches.values()))
        kv_layout = kv_layout or _guess_kv_layout(first)
        planes_per_layer = _PLANES_PER_LAYER[kv_layout]
        planes = [p for t in kv_caches.values() for p in _planes_of(t, kv_layout)]
        shape = _block_shape(first, kv_layout)
        stride_bytes = planes[0].stride(0) * planes[0].element_size()
        plane_bytes = planes[0][0].numel() * planes[0].element_size()
        for name, tensor in kv_caches.items():
            _check_same_geometry(name, tensor, first, kv_layout, stride_bytes)
        return cls(
            engine_id=engine_id,
            tp_rank=tp_rank,
            tp_size=tp_size,
            layer_names=list(kv_caches),
            num_blocks=planes[0].shape[0],
            block_size=shape["block_size"],
            num_kv_heads=shape["num_kv_heads"],
            head_dim=shape["head_dim"],
            dtype=str(first.dtype).removeprefix("torch."),
            kv_layout=kv_layout,
            memory_kind="VRAM" if first.is_cuda else "DRAM",
            device_id=first.device.index or 0,
            planes_per_layer=planes_per_layer,
            plane_bytes_per_block=plane_bytes,
            block_stride_bytes=stride_bytes,
            plane_base_addrs=[p.data_ptr() for p in planes],
        )

    def descriptor_array(self) -> np.ndarray:
        """NIXL descriptors (addr, len, device), one per (plane, block), plane-major."""
        bases = np.asarray(self.plane_base_addrs, dtype=np.uint64)[:, None]
        offsets = np.arange(self.num_blocks, dtype=np.uint64)[None, :] * np.uint64(
            self.block_stride_bytes
        )
        descs = np.empty((self.num_planes * self.num_blocks, 3), dtype=np.uint64)
        descs[:, 0] = (bases + offsets).ravel()
        descs[:, 1] = self.plane_bytes_per_block
        descs[:, 2] = self.device_id
        return descs

    def registration_regions(self) -> list[tuple[int, int]]:
        """Disjoint (addr, length) spans covering every block: what to register with NIXL."""
        span = (self.num_blocks - 1) * self.block_stride_bytes + self.plane_bytes_per_block
        merged: list[tuple[int, int]] = []
        for start in sorted(self.plane_base_addrs):
            end = start + span
            if merged and start <= merged[-1][0] + merged[-1][1]:
                last_start, last_len = merged[-1]
                merged[-1] = (last_start, max(last_start + last_len, end) - last_start)
            else:
                merged.append((start, span))
        return merged

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
    """How local block ids and a peer's block ids turn into NIXL descriptor indices."""

    num_planes: int
    local_num_blocks: int
    remote_num_blocks: int

    def descriptor_ids(
        self, local_block_ids: list[int], remote_block_ids: list[int]
    ) -> tuple[np.ndarray, np.ndarray]:
        """Descriptor indices for every plane of the given blocks, local and remote in step."""
        if len(local_block_ids) != len(remote_block_ids):
            raise ValueError(
                f"{len(local_block_ids)} local block ids for {len(remote_block_ids)} remote ones:"
                " pass one local block per remote block"
            )
        local = _checked_ids(local_block_ids, self.local_num_blocks, "local")
        remote = _checked_ids(remote_block_ids, self.remote_num_blocks, "remote")
        planes = np.arange(self.num_planes, dtype=np.int64)[:, None]
        local_idx = (planes * self.local_num_blocks + local[None, :]).ravel()
        remote_idx = (planes * self.remote_num_blocks + remote[None, :]).ravel()
        return local_idx.astype(np.int32), remote_idx.astype(np.int32)


def check_compatible(local: KVLayout, remote: KVLayout) -> BlockMapping:
    """The block mapping between two sides, or LayoutMismatchError listing every difference."""
    problems = [
        f"{what}: local {mine!r}, remote {theirs!r} ({fix})"
        for what, mine, theirs, fix in _compared_properties(local, remote)
        if mine != theirs
    ]
    if problems:
        raise LayoutMismatchError(
            f"engine {remote.engine_id!r} (tp rank {remote.tp_rank}) cannot send KV blocks to "
            f"engine {local.engine_id!r}: " + "; ".join(problems)
        )
    return BlockMapping(local.num_planes, local.num_blocks, remote.num_blocks)


def _compared_properties(local: KVLayout, remote: KVLayout) -> list[tuple[str, Any, Any, str]]:
    same_model = "serve the same model on both sides"
    return [
        ("block_size in tokens", local.block_size, remote.block_size,
         "start both engines with the same --block-size"),
        ("dtype", local.dtype, remote.dtype, "start both engines with the same --kv-cache-dtype"),
        ("kv layout", local.kv_layout, remote.kv_layout,
         "use the same attention backend and device type on both sides"),
        ("num_kv_heads", local.num_kv_heads, remote.num_kv_heads,
         f"{same_model} with the same tensor-parallel size"),
        ("head_dim", local.head_dim, remote.head_dim, same_model),
        ("num layers", local.num_layers, remote.num_layers, same_model),
        ("tp_size", local.tp_size, remote.tp_size, "use the same tensor-parallel size"),
        ("bytes per block per layer", local.bytes_per_block_per_layer,
         remote.bytes_per_block_per_layer, same_model),
    ]  # fmt: skip


def _guess_kv_layout(tensor: torch.Tensor) -> str:
    if tensor.dim() == 4 and not tensor.is_cuda:
        return KV_LAYOUT_CPU
    if tensor.dim() == 5 and tensor.shape[0] == 2:
        return KV_LAYOUT_CUDA
    raise ValueError(
        f"unknown KV cache shape {tuple(tensor.shape)} on {tensor.device}: pass kv_layout="
        f"{KV_LAYOUT_CPU!r} or {KV_LAYOUT_CUDA!r}"
    )


def _planes_of(tensor: torch.Tensor, kv_layout: str) -> list[torch.Tensor]:
    """The tensor's planes, each indexed by block id first."""
    return [tensor] if kv_layout == KV_LAYOUT_CPU else [tensor[0], tensor[1]]


def _block_shape(tensor: torch.Tensor, kv_layout: str) -> dict[str, int]:
    if kv_layout == KV_LAYOUT_CPU:
        _, heads, tokens, kv_dim = tensor.shape
        return {"block_size": tokens, "num_kv_heads": heads, "head_dim": kv_dim // 2}
    _, _, tokens, heads, head_dim = tensor.shape
    return {"block_size": tokens, "num_kv_heads": heads, "head_dim": head_dim}


def _check_same_geometry(
    name: str, tensor: torch.Tensor, first: torch.Tensor, kv_layout: str, stride_bytes: int
) -> None:
    """Every layer must share shape, dtype, device and block stride, with contiguous blocks."""
    if tensor.shape != first.shape or tensor.dtype != first.dtype or tensor.device != first.device:
        raise ValueError(
            f"layer {name!r} is {tuple(tensor.shape)} {tensor.dtype} on {tensor.device}, the first"
            f" layer {tuple(first.shape)} {first.dtype} on {first.device}: all layers must match"
        )
    for plane in _planes_of(tensor, kv_layout):
        if not plane[0].is_contiguous() or plane.stride(0) * plane.element_size() != stride_bytes:
            raise ValueError(
                f"layer {name!r}: a block is not one contiguous run of bytes at a fixed stride;"
                " the P2P transport needs vLLM's standard KV cache layout"
            )


def _check_wire_field(name: str, type_name: Any, value: Any) -> None:
    if type_name == "str":
        ok = isinstance(value, str) and len(value) <= 256
    elif type_name == "int":
        ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**64
    elif name == "layer_names":
        ok = isinstance(value, list) and len(value) <= MAX_WIRE_LAYERS
        ok = ok and all(isinstance(v, str) and len(v) <= 256 for v in value)
    else:  # plane_base_addrs
        ok = isinstance(value, list) and len(value) <= 2 * MAX_WIRE_LAYERS
        ok = ok and all(isinstance(v, int) and 0 <= v < 2**64 for v in value)
    if not ok:
        raise ValueError(f"layout field {name!r} has a bad value: {str(value)[:80]}")


def _check_wire_consistent(layout: KVLayout) -> None:
    if _PLANES_PER_LAYER.get(layout.kv_layout) != layout.planes_per_layer:
        raise ValueError(f"layout {layout.kv_layout!r} with {layout.planes_per_layer} planes")
    if len(layout.plane_base_addrs) != layout.num_planes or layout.num_blocks == 0:
        raise ValueError(
            f"layout has {len(layout.plane_base_addrs)} plane addresses for {layout.num_layers}"
            f" layers x {layout.planes_per_layer} planes and {layout.num_blocks} blocks"
        )
    if layout.memory_kind not in ("DRAM", "VRAM"):
        raise ValueError(f"layout memory kind {layout.memory_kind!r} is neither DRAM nor VRAM")


def _checked_ids(block_ids: list[int], num_blocks: int, side: str) -> np.ndarray:
    ids = np.asarray(block_ids, dtype=np.int64)
    if ids.ndim != 1 or (ids.size and (ids.min() < 0 or ids.max() >= num_blocks)):
        raise ValueError(
            f"{side} block ids must lie in [0, {num_blocks}), got {list(block_ids)[:8]}..."
        )
    return ids
