"""What vLLM's engine core does before a GPU worker allocates its KV cache, with vLLM's own code.

It resolves one layout from the backends' declarations and the connector's preference
(`get_supported_kv_cache_layouts`, `resolve_kv_cache_layout`), plans the KVCacheConfig every
worker gets (planning.py) and the scheduler's (`generate_scheduler_kv_cache_config`). Under
vLLM 0.34's extensible KV cache the plan's block count is the reserved capacity.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final
from unittest import mock

from tests.gpu_handoff.backends import BackendDecl, backend
from tests.gpu_handoff.planning import plan_kv_cache_configs

if TYPE_CHECKING:
    from vllm.config import KVTransferConfig, VllmConfig
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheSpec
    from vllm.v1.kv_cache_layout import KVCacheLayout

MODEL_KINDS: Final = ("full", "sliding_window", "hybrid", "mla")
"""Model kinds: full attention; sliding window; a hybrid of both (two KV cache groups); MLA."""
KV_DTYPES: Final = ("auto", "fp8")
"""KV cache dtypes the suite covers: the model's bf16, and fp8 (stored as uint8 on CUDA)."""
NUM_KV_HEADS: Final = 2
"""KV heads of the standard kinds' layers (on one rank)."""
HEAD_SIZE: Final = 64
"""Head size of the standard kinds' layers (every CUDA backend takes 64)."""
MLA_HEAD_SIZE: Final = 576
"""DeepSeek's MLA cache entry: a 512-wide latent plus 64 rope dims, one 'head' per layer."""
LAYER_NAME: Final = "model.layers.{}.self_attn.attn"
"""vLLM's attention layer names (vLLM reads the layer index out of them)."""


@dataclass(frozen=True)
class EnginePlan:
    """The engine core's decisions a worker then allocates from."""

    vllm_config: VllmConfig
    backend: BackendDecl
    vllm_backend: object  # vLLM's backend class, or the table entry where it cannot import
    kind: str
    kv_cache_dtype: str
    layout: KVCacheLayout
    engine_config: KVCacheConfig  # the config the engine core sends every worker
    scheduler_config: KVCacheConfig
    shared_layers: dict[str, str]  # KV-sharing layer -> the layer whose cache it reuses


def plan_engine(
    backend_name: str,
    kind: str,
    block_size: int,
    kv_cache_dtype: str,
    num_blocks: int,
    num_layers: int,
    *,
    model: Path,
    kv_transfer_config: KVTransferConfig | None,
    num_shared_layers: int,
    tensor_parallel_size: int,
    layout: str | None,
    extensible: bool = False,
    max_model_blocks: int | None = None,
) -> EnginePlan:
    """The engine core's plan for one backend serving one model kind (see build_worker_kv_caches
    for the arguments). `extensible` turns vLLM 0.34's extensible KV cache on; `num_blocks` is
    then its capacity, and `max_model_blocks` the blocks max_model_len must fit in."""
    from vllm.v1.attention.backends.utils import (
        get_supported_kv_cache_layouts,
        resolve_kv_cache_layout,
    )
    from vllm.v1.core.kv_cache_utils import generate_scheduler_kv_cache_config

    decl = backend(backend_name)
    _check_served(decl, kind, kv_cache_dtype)
    vllm_config = _vllm_config(model, tensor_parallel_size)
    vllm_config.kv_transfer_config = kv_transfer_config
    cache_config = vllm_config.cache_config
    cache_config.block_size = block_size
    cache_config.cache_dtype = kv_cache_dtype
    # Stands for the memory profiling finds: vLLM plans exactly this many blocks from it.
    cache_config.num_gpu_blocks_override = num_blocks
    # vLLM checks that one request of max_model_len fits (a hybrid model's in two groups).
    fits = max_model_blocks or num_blocks
    vllm_config.model_config.max_model_len = max(1, fits // 2 - 2) * block_size
    if extensible:
        cache_config.enable_extensible_kv_cache = True
    specs = _layer_specs(vllm_config, kind, block_size, kv_cache_dtype, num_layers)
    vllm_backend = decl.vllm_class()
    supported = [layout.name for layout in get_supported_kv_cache_layouts([vllm_backend])]
    with requested_layout(layout):
        resolved = resolve_kv_cache_layout(vllm_config, [supported], specs.values())
    [engine_config] = plan_kv_cache_configs(vllm_config, [specs], [1 << 40])
    if extensible:
        cache_config.num_gpu_blocks_override = None  # vLLM refuses it beside the extensible cache
    engine_config.kv_cache_layout = resolved.name
    cache_config.num_gpu_blocks = engine_config.num_blocks  # as the engine core records it
    scheduler_config = generate_scheduler_kv_cache_config([engine_config])
    owning = num_layers * (2 if kind == "hybrid" else 1)
    shared = {
        LAYER_NAME.format(owning + i): LAYER_NAME.format(owning - 1 - i)
        for i in range(num_shared_layers)
    }
    return EnginePlan(
        vllm_config=vllm_config,
        backend=decl,
        vllm_backend=vllm_backend,
        kind=kind,
        kv_cache_dtype=kv_cache_dtype,
        layout=resolved,
        engine_config=engine_config,
        scheduler_config=scheduler_config,
        shared_layers=shared,
    )


@contextmanager
def requested_layout(layout: str | None) -> Iterator[None]:
    """VLLM_KV_CACHE_LAYOUT as vLLM reads it, set to `layout` (None: unset) within the context:
    vLLM's resolution then takes it only where every backend can use it."""
    import vllm.envs as envs

    with mock.patch.object(envs, "VLLM_KV_CACHE_LAYOUT", layout, create=True):
        yield


def _check_served(decl: BackendDecl, kind: str, kv_cache_dtype: str) -> None:
    if kind not in MODEL_KINDS:
        raise ValueError(f"unknown model kind {kind!r}: one of {MODEL_KINDS}")
    if kind not in decl.kinds:
        raise ValueError(f"{decl.name} serves {decl.kinds}, not {kind}")
    if kv_cache_dtype not in decl.kv_cache_dtypes:
        raise ValueError(f"{decl.name} takes KV cache dtypes {decl.kv_cache_dtypes}")


def _layer_specs(
    vllm_config: VllmConfig, kind: str, block_size: int, kv_cache_dtype: str, num_layers: int
) -> dict[str, KVCacheSpec]:
    """Each layer's KV spec, with the fields vLLM's attention layers fill in."""
    from vllm.utils.torch_utils import kv_cache_dtype_str_to_dtype
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        MLAAttentionSpec,
        SlidingWindowSpec,
        get_kv_quant_mode,
    )

    dtype = kv_cache_dtype_str_to_dtype(kv_cache_dtype, vllm_config.model_config)
    quant = get_kv_quant_mode(kv_cache_dtype)
    if kind == "mla":
        spec = MLAAttentionSpec(
            block_size=block_size,
            num_kv_heads=1,
            max_tp_shards=1,
            head_size=MLA_HEAD_SIZE,
            dtype=dtype,
            cache_dtype_str=kv_cache_dtype,
            kv_quant_mode=quant,
        )
        return {LAYER_NAME.format(i): spec for i in range(num_layers)}
    full = FullAttentionSpec(
        block_size=block_size,
        num_kv_heads=NUM_KV_HEADS,
        head_size=HEAD_SIZE,
        dtype=dtype,
        kv_quant_mode=quant,
    )
    window = SlidingWindowSpec(
        block_size=block_size,
        num_kv_heads=NUM_KV_HEADS,
        head_size=HEAD_SIZE,
        dtype=dtype,
        kv_quant_mode=quant,
        sliding_window=2 * block_size,
    )
    if kind == "hybrid":
        return {LAYER_NAME.format(i): (full, window)[i % 2] for i in range(2 * num_layers)}
    spec = full if kind == "full" else window
    return {LAYER_NAME.format(i): spec for i in range(num_layers)}


@functools.cache
def _base_vllm_config(model: Path, tensor_parallel_size: int) -> VllmConfig:
    """One VllmConfig per model and TP size (building one takes seconds); callers copy it."""
    from vllm.config import CacheConfig, DeviceConfig, ModelConfig, ParallelConfig, VllmConfig

    return VllmConfig(
        model_config=ModelConfig(model=str(model), skip_tokenizer_init=True, max_model_len=256),
        cache_config=CacheConfig(block_size=16),
        parallel_config=ParallelConfig(tensor_parallel_size=tensor_parallel_size),
        device_config=DeviceConfig("cpu"),
    )


def _vllm_config(model: Path, tensor_parallel_size: int) -> VllmConfig:
    config = copy.deepcopy(_base_vllm_config(Path(model), tensor_parallel_size))
    # CUDA keeps the hybrid KV cache manager on (the CPU platform turns it off): two groups.
    config.scheduler_config.disable_hybrid_kv_cache_manager = False
    return config
