"""vLLM's KV cache layouts by name, and the one KV view per memory a connector copies or reads."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    import torch
    from vllm.v1.kv_cache_interface import KVCacheConfig

KV_CACHE_LAYOUTS: Final = ("LBHNC", "LBNHC", "LHBNC", "BLHNC", "BLNHC", "BHLNC")
"""vLLM's `KVCacheLayout` names: the physical order of [L, B, H, N, C] (layers, blocks, KV heads,
tokens, content). Named here, not imported, so that this module needs no vLLM."""
_ALIASES: Final = {"NHD": "LBNHC", "HND": "LBHNC"}  # vLLM's legacy names


class KVLayoutError(ValueError):
    """The KV views cannot be described as runs of bytes; the message says what to set."""


def layout_name(layout: Any) -> str:
    """A vLLM layout (a `KVCacheLayout`, its name, or a legacy NHD/HND alias) as its name."""
    name = getattr(layout, "name", layout)
    name = _ALIASES.get(str(name).upper(), str(name).upper())
    if name not in KV_CACHE_LAYOUTS:
        raise KVLayoutError(f"unknown KV cache layout {layout!r}: one of {KV_CACHE_LAYOUTS}")
    return name


def distinct_kv_memories(
    kv_caches: dict[str, torch.Tensor], kv_cache_config: KVCacheConfig | None
) -> dict[str, torch.Tensor]:
    """One KV view per memory: with several KV cache groups vLLM overlays one layer of each
    group on a tensor, and it aliases KV-sharing layers (YOCO, Gemma-3n) to the view of the
    layer whose KV they reuse, so copying, registering or reading every view would move the
    same bytes twice. The first name in the groups' order names each memory."""
    groups = getattr(kv_cache_config, "kv_cache_groups", None) or ()
    ordered = [name for g in groups for name in g.layer_names]
    ordered += [name for name in kv_caches if name not in set(ordered)]
    layers: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for name in ordered:
        if name in kv_caches and (address := kv_caches[name].data_ptr()) not in seen:
            seen.add(address)
            layers[name] = kv_caches[name]
    return layers
