"""The KV caches a CUDA GPU worker of vLLM 0.32 hands `register_kv_caches`, rebuilt on CPU memory.

Every step is vLLM's own code, in the order its GPU worker runs it: the engine core resolves one
layout from the backends' declarations and the connector's preference
(`get_supported_kv_cache_layouts`, `resolve_kv_cache_layout`), plans the KVCacheConfig
(`get_kv_cache_configs`, `generate_scheduler_kv_cache_config` for the scheduler), the worker
builds its connector from that config, then adds KV-sharing layers to its groups
(`add_kv_sharing_layers_to_kv_cache_groups`), picks each group's kernel block size
(`prepare_kernel_block_sizes`), allocates and views the caches (`allocate_kv_cache`, which calls
`create_kv_cache_views(..., kernel_block_size=...)`) and aliases the sharing layers into the dict,
as `gpu_model_runner.initialize_kv_cache_tensors` does. Only the device differs: CPU memory.

Stable API (other connectors' hand-off tests use it): `build_worker_kv_caches(...) -> HandOff`,
`handoff_cases()`, `MODEL_KINDS`, `KV_DTYPES`.
"""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

import torch

from tests.gpu_handoff.backends import CUDA_BACKENDS, BackendDecl, backend

if TYPE_CHECKING:
    from vllm.config import KVTransferConfig, VllmConfig
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheSpec

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
class HandOff:
    """What a GPU worker gives a connector: its caches, and the configs its halves get."""

    kv_caches: dict[str, torch.Tensor]  # exactly register_kv_caches' argument, aliases included
    kv_cache_config: KVCacheConfig  # the worker's connector is built with this (before aliasing)
    scheduler_kv_cache_config: KVCacheConfig  # the scheduler's connector is built with this
    runner_kv_cache_config: KVCacheConfig  # the model runner's copy, sharing layers in its groups
    vllm_config: VllmConfig
    layout: str  # the layout vLLM resolved, e.g. "LBNHC"
    kernel_block_sizes: tuple[int, ...]  # per KV cache group
    backend: BackendDecl
    kind: str
    kv_cache_dtype: str
    shared_layers: dict[str, str]  # KV-sharing layer -> the layer whose cache it reuses

    @property
    def num_blocks(self) -> int:
        return self.kv_cache_config.num_blocks

    @property
    def block_size(self) -> int:
        return self.kv_cache_config.kv_cache_groups[0].kv_cache_spec.block_size

    @property
    def kernel_block_size(self) -> int:
        return self.kernel_block_sizes[0]

    @property
    def blocks_per_kv_block(self) -> int:
        """Kernel blocks per KV block: the views have num_blocks times this many rows."""
        return self.block_size // self.kernel_block_size

    def block_bytes(self, layer_name: str, block_id: int) -> torch.Tensor:
        """The bytes of one KV block of one layer as vLLM's view shows them (its kernel blocks
        included), flat uint8 in logical order: compare these, not values (fp8 NaNs)."""
        view = self.kv_caches[layer_name]
        ratio = view.shape[0] // self.num_blocks
        rows = view[block_id * ratio : (block_id + 1) * ratio]
        return rows.contiguous().view(torch.uint8).reshape(-1).clone()


def build_worker_kv_caches(
    backend_name: str,
    kind: str,
    block_size: int,
    kv_cache_dtype: str = "auto",
    num_blocks: int = 8,
    num_layers: int = 2,
    *,
    model: Path,
    kv_transfer_config: KVTransferConfig | None = None,
    num_shared_layers: int = 0,
    tensor_parallel_size: int = 1,
    layout: str | None = None,
) -> HandOff:
    """The hand-off of one backend serving one model kind, as a GPU worker builds it.

    `num_layers` layers own KV (a hybrid model has that many of each kind); `num_shared_layers`
    more reuse the KV of the last layers (as YOCO/Gemma-3n models do). `layout` forces a layout
    (as VLLM_KV_CACHE_LAYOUT does); None resolves it as vLLM does, the connector's preference
    included. Raises vLLM's own error where vLLM would refuse to start (e.g. no common block
    size, an unsupported dtype).
    """
    from vllm.v1.attention.backends.utils import (
        get_supported_kv_cache_layouts,
        resolve_kv_cache_layout,
    )
    from vllm.v1.core.kv_cache_utils import (
        generate_scheduler_kv_cache_config,
        get_kv_cache_configs,
    )
    from vllm.v1.kv_cache_layout import KVCacheLayout
    from vllm.v1.worker.utils import (
        add_kv_sharing_layers_to_kv_cache_groups,
        allocate_kv_cache,
        prepare_kernel_block_sizes,
    )

    decl = backend(backend_name)
    _check_served(decl, kind, kv_cache_dtype)
    vllm_config = _vllm_config(model, tensor_parallel_size)
    vllm_config.kv_transfer_config = kv_transfer_config
    cache_config = vllm_config.cache_config
    cache_config.block_size = block_size
    cache_config.cache_dtype = kv_cache_dtype
    cache_config.num_gpu_blocks_override = num_blocks
    # vLLM checks that one request of max_model_len fits (a hybrid model's in two groups).
    vllm_config.model_config.max_model_len = max(1, num_blocks // 2 - 2) * block_size
    cache_config.kv_cache_layout = layout and KVCacheLayout[layout].name
    specs = _layer_specs(vllm_config, kind, block_size, kv_cache_dtype, num_layers)
    vllm_backend = decl.vllm_class()
    supported = [layout.name for layout in get_supported_kv_cache_layouts([vllm_backend])]
    resolved = resolve_kv_cache_layout(vllm_config, [supported], specs.values())
    [engine_config] = get_kv_cache_configs(vllm_config, [specs], [1 << 40])
    engine_config.kv_cache_layout = resolved.name
    cache_config.num_gpu_blocks = engine_config.num_blocks  # as the engine core records it
    scheduler_config = generate_scheduler_kv_cache_config([engine_config])
    worker_config = copy.deepcopy(engine_config)
    runner_config = copy.deepcopy(engine_config)
    shared = {
        LAYER_NAME.format(num_layers * _layers_per_index(kind) + i): LAYER_NAME.format(
            num_layers * _layers_per_index(kind) - 1 - i
        )
        for i in range(num_shared_layers)
    }
    add_kv_sharing_layers_to_kv_cache_groups(shared, runner_config.kv_cache_groups)
    attn_groups = [
        [_AttentionGroup(vllm_backend, group.kv_cache_spec)]
        for group in runner_config.kv_cache_groups
    ]
    kernel_block_sizes = prepare_kernel_block_sizes(runner_config, attn_groups)
    kv_caches = allocate_kv_cache(runner_config, torch.device("cpu"), resolved, kernel_block_sizes)
    for layer_name, target in shared.items():
        kv_caches[layer_name] = kv_caches[target]
    return HandOff(
        kv_caches=kv_caches,
        kv_cache_config=worker_config,
        scheduler_kv_cache_config=scheduler_config,
        runner_kv_cache_config=runner_config,
        vllm_config=vllm_config,
        layout=resolved.name,
        kernel_block_sizes=tuple(kernel_block_sizes),
        backend=decl,
        kind=kind,
        kv_cache_dtype=kv_cache_dtype,
        shared_layers=shared,
    )


def handoff_cases(
    block_sizes: tuple[int, ...] = (16, 64, 128, 256), dtypes: tuple[str, ...] = KV_DTYPES
) -> list[tuple[str, str, int, str]]:
    """(backend, kind, block size, KV dtype) for every combination vLLM itself would start:
    the backend serves the kind and dtype, and some kernel block size of it divides the block."""
    from vllm.v1.worker.utils import select_common_block_size

    cases = []
    for decl in CUDA_BACKENDS:
        for kind in decl.kinds:
            for block_size in block_sizes:
                try:
                    select_common_block_size(block_size, [decl], [None])
                except ValueError:
                    continue
                cases += [
                    (decl.name, kind, block_size, dtype)
                    for dtype in dtypes
                    if dtype in decl.kv_cache_dtypes
                ]
    return cases


@dataclass(frozen=True)
class _AttentionGroup:
    """The two fields of vLLM's AttentionGroup that prepare_kernel_block_sizes reads."""

    backend: object
    kv_cache_spec: KVCacheSpec


def _check_served(decl: BackendDecl, kind: str, kv_cache_dtype: str) -> None:
    if kind not in MODEL_KINDS:
        raise ValueError(f"unknown model kind {kind!r}: one of {MODEL_KINDS}")
    if kind not in decl.kinds:
        raise ValueError(f"{decl.name} serves {decl.kinds}, not {kind}")
    if kv_cache_dtype not in decl.kv_cache_dtypes:
        raise ValueError(f"{decl.name} takes KV cache dtypes {decl.kv_cache_dtypes}")


def _layers_per_index(kind: str) -> int:
    return 2 if kind == "hybrid" else 1


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
