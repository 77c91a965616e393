"""vLLM's KV cache planning of the engine core, from where the installed release keeps it.

vLLM 0.34 moved `get_kv_cache_configs` to `kv_cache_planning` and has the engine core group the
whole model's layers first (`get_global_kv_cache_groups`), passing the groups in; 0.32 groups
them inside `kv_cache_utils.get_kv_cache_configs`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheSpec


def plan_kv_cache_configs(
    vllm_config: VllmConfig, kv_cache_specs: list[dict[str, KVCacheSpec]], memory: list[int]
) -> list[KVCacheConfig]:
    """Each worker's KVCacheConfig, as the engine core plans them from the workers' specs and
    free memory (the block count still capped by `num_gpu_blocks_override`)."""
    try:
        from vllm.v1.core.kv_cache_planning import (
            get_global_kv_cache_groups,
            get_kv_cache_configs,
        )
    except ImportError:  # vLLM 0.32/0.33
        from vllm.v1.core.kv_cache_utils import get_kv_cache_configs as plan

        return plan(vllm_config, kv_cache_specs, memory)
    groups = get_global_kv_cache_groups(vllm_config, kv_cache_specs)
    vllm_config.adjust_dcp_kv_cache_interleave_size(groups)
    return get_kv_cache_configs(vllm_config, kv_cache_specs, memory, groups)
