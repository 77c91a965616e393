"""What vLLM asks the Multi's class before any connector exists, answered from its children's
classes: KV cache layout, CUDA graph mode, sleep mode, hybrid KV cache manager support, KV
cache access and lookahead block hashes."""

from typing import TYPE_CHECKING, Any

from kvscope.connector.common.kv_cache_access import (
    KVCacheAccess,
    configured_access,
    lookahead_hashing,
)
from kvscope.connector.multi.children import (
    child_class,
    child_configs,
    child_supports_hma,
    child_vllm_config,
    configured_class,
    transfer_config,
)
from kvscope.connector.multi.groups import refuse_children_without_hma as refuse

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.config.kv_transfer import KVTransferConfig


def required_kvcache_layout(vllm_config: "VllmConfig") -> str | None:
    """The one layout the children need, if any; children needing two cannot share a cache.

    A child whose class says `yields_kv_cache_layout()` (the offload connector: its copies
    serve any layout) only prefers its layout: it counts when no other child asks for one.
    """
    outer = vllm_config.kv_transfer_config
    asked: set[str] = set()
    yielding: set[str] = set()
    for config in child_configs(outer.kv_connector_extra_config or {}, outer.kv_role):
        child = child_class(config, outer)
        layout = child.get_required_kvcache_layout(child_vllm_config(config, vllm_config))
        if layout is not None:
            yields = getattr(child, "yields_kv_cache_layout", None)
            (yielding if yields is not None and yields() else asked).add(layout)
    layouts = asked or yielding
    if len(layouts) > 1:
        raise ValueError(f"children need different KV cache layouts {sorted(layouts)}")
    return next(iter(layouts), None)


def requires_piecewise_for_cudagraph(extra_config: dict[str, Any]) -> bool:
    """True when any child needs PIECEWISE CUDA graphs: the Multi's own per-layer hooks
    only forward. Each child is asked as it is built here (kvscope's traced children as
    their untraced core, with their own extra config), so a child's trace_layer_mode
    asks nothing: the Multi gives its children no per-layer spans."""
    return any(
        child_class(config).requires_piecewise_for_cudagraph(
            config.get("kv_connector_extra_config") or {}
        )
        for config in child_configs(extra_config)
    )


def supports_sleep_mode(kv_transfer_config: "KVTransferConfig") -> bool:
    """vLLM 0.33's question: only when every child follows sleep mode (as vLLM's
    MultiConnector); each child's class is asked with its own config, kvscope's traced
    ones through their wrapper (which asks what it wraps)."""
    configs = _children(kv_transfer_config)
    return bool(configs) and all(
        _class_supports_sleep_mode(
            configured_class(config, kv_transfer_config),
            transfer_config(config, kv_transfer_config),
        )
        for config in configs
    )


def _class_supports_sleep_mode(cls: type, kv_transfer_config: "KVTransferConfig") -> bool:
    ask = getattr(cls, "supports_sleep_mode", None)  # vLLM 0.33; 0.32's classes have none
    return True if ask is None else ask(kv_transfer_config)


def kv_cache_access(kv_transfer_config: "KVTransferConfig") -> "KVCacheAccess":
    """vLLM 0.34's question: the OR of the children's flags (as vLLM's MultiConnector), each
    child asked through vLLM's factory with its own config."""
    access = KVCacheAccess.IN_PROCESS
    for config in _children(kv_transfer_config):
        access |= configured_access(transfer_config(config, kv_transfer_config))
    return access


def supports_lookahead_block_hashes(kv_transfer_config: "KVTransferConfig") -> bool:
    """vLLM 0.34's question: only when every child hashes with lookahead tokens (as vLLM's
    MultiConnector): the children share one scheduler's block hashes."""
    configs = _children(kv_transfer_config)
    return bool(configs) and all(
        lookahead_hashing(
            configured_class(config, kv_transfer_config),
            transfer_config(config, kv_transfer_config),
        )
        for config in configs
    )


def _children(kv_transfer_config: "KVTransferConfig") -> list[dict]:
    extra = kv_transfer_config.kv_connector_extra_config or {}
    return child_configs(extra, kv_transfer_config.kv_role)


def refuse_children_without_hma(outer: "KVTransferConfig", groups: int) -> None:
    """Refuses, naming them, children that cannot take several KV cache groups."""
    configs = _children(outer)
    children = [
        (c["name"], child_class(c, outer).__name__, child_supports_hma(c, outer)) for c in configs
    ]
    refuse(children, groups)
