"""The KV cache layout the offload connector asks vLLM for (vLLM resolves it with the others')."""

from typing import TYPE_CHECKING, Final

from kvscope.connector.common.kv_layout import layout_name

if TYPE_CHECKING:
    from vllm.config import VllmConfig

PREFERRED_LAYOUT: Final = "LBHNC"
"""Layers outermost, then blocks, heads before tokens: a block of one layer is one contiguous
run. The per-layer views of LBNHC, CUDA's default, are not: every copy goes through a gather."""
EXTRA_LAYOUT: Final = "kv_cache_layout"
"""kv_connector_extra_config key overriding PREFERRED_LAYOUT ("none": state no preference)."""


def preferred_layout(vllm_config: "VllmConfig") -> str | None:
    """LBHNC on CUDA-alike devices (vLLM's own offloader asks for it); None on the CPU, whose
    attention backend reads only LBHNC (a preference would only warn), and for MLA, whose
    pages have no heads to order. Any layout works: vLLM drops it, warning, when the backends
    cannot use it. The extra config key kv_cache_layout overrides it ("none": no preference)."""
    model_config = getattr(vllm_config, "model_config", None)
    if model_config is None or getattr(model_config, "use_mla", False):
        return None
    extra = getattr(vllm_config.kv_transfer_config, "kv_connector_extra_config", None) or {}
    asked = extra.get(EXTRA_LAYOUT)
    if asked is not None:
        return None if str(asked).lower() == "none" else layout_name(asked)
    return None if _platform_is_cpu() else PREFERRED_LAYOUT


def _platform_is_cpu() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()
