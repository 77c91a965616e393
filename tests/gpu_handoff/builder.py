"""The KV caches a CUDA GPU worker of vLLM hands `register_kv_caches`, rebuilt on CPU memory.

Every step is vLLM's own code, in the order its GPU worker runs it: the engine core's plan
(engine_core.py: the layout, the KVCacheConfig, the scheduler's), then the worker builds its
connector from that config, adds KV-sharing layers to its groups
(`add_kv_sharing_layers_to_kv_cache_groups`), picks each group's kernel block size
(`prepare_kernel_block_sizes`), allocates and views the caches (`allocate_kv_cache`, which calls
`create_kv_cache_views(..., kernel_block_size=...)`) and aliases the sharing layers into the dict,
as vLLM 0.32's `initialize_kv_cache_tensors` and 0.34's `bind_kv_caches` do. Only the device
differs: CPU memory. vLLM 0.34's extensible KV cache, which creates the connector later over
committed memory, is extensible.py's.

Stable API (other connectors' hand-off tests use it): `build_worker_kv_caches(...) -> HandOff`,
`handoff_cases()`, `MODEL_KINDS`, `KV_DTYPES`.
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import torch

from tests.gpu_handoff.backends import CUDA_BACKENDS, BackendDecl
from tests.gpu_handoff.engine_core import (
    KV_DTYPES,
    LAYER_NAME,
    MODEL_KINDS,
    EnginePlan,
    plan_engine,
)

if TYPE_CHECKING:
    from vllm.config import KVTransferConfig, VllmConfig
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheSpec

__all__ = ["KV_DTYPES", "LAYER_NAME", "MODEL_KINDS", "HandOff", "build_worker_kv_caches"]

BLOCK_SIZES: Final = (16, 64, 128, 256)
"""KV block sizes the suites cover (256 splits into kernel blocks for every backend that has
them; 16 is the smallest most take whole)."""
BLOCK_SIZES_ENV: Final = "KVSCOPE_HANDOFF_BLOCK_SIZES"
"""Narrows BLOCK_SIZES for a shorter run (the vLLM 0.34 lane runs "256")."""


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
    # vLLM 0.34's ExtensibleKVCache the views are over (None: allocated up front). It owns
    # their memory: the hand-off keeps it alive.
    extensible_kv_cache: Any = None

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
    from vllm.v1.worker.utils import allocate_kv_cache

    plan = plan_engine(
        backend_name,
        kind,
        block_size,
        kv_cache_dtype,
        num_blocks,
        num_layers,
        model=model,
        kv_transfer_config=kv_transfer_config,
        num_shared_layers=num_shared_layers,
        tensor_parallel_size=tensor_parallel_size,
        layout=layout,
    )
    worker_config = copy.deepcopy(plan.engine_config)
    runner_config = copy.deepcopy(plan.engine_config)
    kernel_block_sizes = runner_kernel_block_sizes(plan, runner_config)
    kv_caches = allocate_kv_cache(
        runner_config, torch.device("cpu"), plan.layout, kernel_block_sizes
    )
    for layer_name, target in plan.shared_layers.items():
        kv_caches[layer_name] = kv_caches[target]
    return HandOff(
        kv_caches=kv_caches,
        kv_cache_config=worker_config,
        scheduler_kv_cache_config=plan.scheduler_config,
        runner_kv_cache_config=runner_config,
        vllm_config=plan.vllm_config,
        layout=plan.layout.name,
        kernel_block_sizes=tuple(kernel_block_sizes),
        backend=plan.backend,
        kind=kind,
        kv_cache_dtype=kv_cache_dtype,
        shared_layers=plan.shared_layers,
    )


def runner_kernel_block_sizes(plan: EnginePlan, runner_config: KVCacheConfig) -> list[int]:
    """What the model runner does before it allocates: KV-sharing layers join their target's
    group in its copy of the config, and each group gets the kernel block size its backend
    takes (vLLM 0.34's `init_attn_backend`, 0.32's `initialize_attn_backend`)."""
    from vllm.v1.worker.utils import (
        add_kv_sharing_layers_to_kv_cache_groups,
        prepare_kernel_block_sizes,
    )

    add_kv_sharing_layers_to_kv_cache_groups(plan.shared_layers, runner_config.kv_cache_groups)
    attn_groups = [
        [_AttentionGroup(plan.vllm_backend, group.kv_cache_spec)]
        for group in runner_config.kv_cache_groups
    ]
    return prepare_kernel_block_sizes(runner_config, attn_groups)


def handoff_cases(
    block_sizes: tuple[int, ...] | None = None,
    dtypes: tuple[str, ...] = KV_DTYPES,
    backends: tuple[BackendDecl, ...] = CUDA_BACKENDS,
) -> list[tuple[str, str, int, str]]:
    """(backend, kind, block size, KV dtype) for every combination vLLM itself would start:
    the backend serves the kind and dtype, and some kernel block size of it divides the block
    (`backends`: the installed release's table, or another release's; `block_sizes`: by
    default BLOCK_SIZES, or KVSCOPE_HANDOFF_BLOCK_SIZES, e.g. "256", where it is set)."""
    from vllm.v1.worker.utils import select_common_block_size

    if block_sizes is None:
        chosen = os.environ.get(BLOCK_SIZES_ENV)
        block_sizes = tuple(int(size) for size in chosen.split(",")) if chosen else BLOCK_SIZES

    cases = []
    for decl in backends:
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


def one_case_per_kind() -> list[tuple[str, str, int, str]]:
    """One of handoff_cases() per backend x model kind: its largest block size (kernel-block
    views where the backend splits blocks), fp8 where it takes fp8 (stored as bytes), else the
    model's dtype."""
    chosen: dict[tuple[str, str], tuple[str, str, int, str]] = {}
    for case in handoff_cases():
        backend, kind, block_size, dtype = case
        best = chosen.get((backend, kind))
        if best is None or (block_size, dtype == "fp8") > (best[2], best[3] == "fp8"):
            chosen[(backend, kind)] = case
    return list(chosen.values())


def case_id(case: tuple) -> str:
    """A test id: the case's parts joined."""
    return "-".join(str(part) for part in case)


@dataclass(frozen=True)
class _AttentionGroup:
    """The two fields of vLLM's AttentionGroup that prepare_kernel_block_sizes reads."""

    backend: object
    kv_cache_spec: KVCacheSpec
