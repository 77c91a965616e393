"""What vLLM says about the KV cache layout: the one it resolved, its strides, our preference."""

from __future__ import annotations

import logging
from typing import Any, Final

from kvscope.connector.common.kv_layout import layout_name

logger = logging.getLogger(__name__)

PREFERRED_LAYOUT: Final = "BLNHC"
"""Block-outermost, so a block of every layer is one run and one NIXL descriptor (LB* layouts
need one per layer). Its page order (tokens, then heads) is FlashAttention's native NHD."""
EXTRA_LAYOUT: Final = "kv_cache_layout"
"""kv_connector_extra_config key overriding PREFERRED_LAYOUT ("none": state no preference)."""


def preferred_layout(vllm_config: Any) -> str | None:
    """The layout the connector asks vLLM for (vLLM drops it, warning, when the attention
    backends cannot use it; VLLM_KV_CACHE_LAYOUT overrides it)."""
    model_config = getattr(vllm_config, "model_config", None)
    if model_config is None or getattr(model_config, "use_mla", False):
        return None  # MLA pages have no heads to order: let vLLM choose
    extra = getattr(vllm_config.kv_transfer_config, "kv_connector_extra_config", None) or {}
    asked = extra.get(EXTRA_LAYOUT)
    if asked is not None:
        return None if str(asked).lower() == "none" else layout_name(asked)
    if _platform_is_cpu():
        return None  # its attention backend reads only LBHNC: a preference would only warn
    return PREFERRED_LAYOUT


def resolved_layout(vllm_config: Any, kv_cache_config: Any) -> str | None:
    """The layout vLLM resolved for this engine: the engine core's, else this process's; None
    (the views' strides then name it) only where vLLM resolved none, e.g. a hand-built config."""
    name = getattr(kv_cache_config, "kv_cache_layout", None)
    if name is None:
        try:
            name = vllm_config.cache_config.get_resolved_kv_cache_layout()
        except (AttributeError, ValueError) as exc:
            logger.warning("p2p: vLLM resolved no KV cache layout (%s): reading the views", exc)
            return None
    return layout_name(name)


def tensor_strides(kv_cache_config: Any, layer_names: list[str]) -> tuple[int, int] | None:
    """vLLM's (layer_stride, block_stride) when one KVCacheTensor holds exactly these layers."""
    for tensor in getattr(kv_cache_config, "kv_cache_tensors", None) or []:
        if list(tensor.layers) == list(layer_names):
            return tensor.layer_stride, tensor.block_stride
    return None


def _platform_is_cpu() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()
