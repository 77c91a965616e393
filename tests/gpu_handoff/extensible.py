"""The KV caches a CUDA GPU worker of vLLM 0.34 hands a connector under its extensible KV cache.

0.34's default on CUDA: the worker reserves the KV cache as virtual memory for the planned
capacity (`pad_kv_cache_segments`, `ExtensibleKVCache`), allocates its views over the reservation
with only the null block committed (`allocate_kv_cache(..., allocate=...)`), commits blocks as
warm-up runs, and the engine core then settles the block count measured after warm-up
(`finalize_extensible_kv_cache`). Only then, in `extend_kv_cache`, is the worker's connector
created, from a KVCacheConfig of the committed block count whose tensors are
`committed_kv_cache_tensors`, and handed `committed_views`: views whose storage spans only
committed bytes. A segment is remapped into one physical chunk (`commit(defragment=True)`) only
where the connector registers the memory (`registers_kv_cache_memory`: P2P does; the offload
connector copies in process), so the offload connector gets segments of several chunks.
Every step is vLLM's own code, over host memory (host_vmm.py).
"""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING, Final

from tests.gpu_handoff.builder import HandOff, runner_kernel_block_sizes
from tests.gpu_handoff.engine_core import plan_engine

if TYPE_CHECKING:
    from vllm.config import KVTransferConfig

EXTENSIBLE_KV_CACHE: Final = importlib.util.find_spec("vllm.v1.worker.extensible_kv_cache")
"""Whether the installed vLLM has the extensible KV cache (0.34 does, 0.32 does not)."""
NO_EXTENSIBLE_KV_CACHE: Final = "this vLLM has no extensible KV cache (vLLM 0.34 has)"
"""Why tests of it skip on vLLM 0.32."""
MIN_COMMITTED_BLOCKS: Final = 16
"""The fewest blocks a hand-off commits (its capacity is twice that)."""
COMMITTED_GRANULES: Final = 3
"""Granules (2 MiB) each segment's committed blocks span at least, so that warm-up's and
extend_kv_cache's commits map chunks of their own where nothing defragments."""


def build_extensible_kv_caches(
    backend_name: str,
    kind: str,
    block_size: int,
    kv_cache_dtype: str = "auto",
    num_layers: int = 2,
    *,
    model: Path,
    kv_transfer_config: KVTransferConfig | None = None,
    num_shared_layers: int = 0,
    layout: str | None = None,
    committed_blocks: int | None = None,
    capacity_blocks: int | None = None,
) -> HandOff:
    """The hand-off `extend_kv_cache` gives the connector, for one backend serving one model kind
    (arguments as build_worker_kv_caches'). The committed block count is what warm-up
    measured: by default the smallest (at least MIN_COMMITTED_BLOCKS) whose segments span
    COMMITTED_GRANULES granules; the capacity by default twice it. The hand-off's
    `extensible_kv_cache` owns the memory: free it with `free_extensible(handoff)` once no
    connector uses it."""
    from vllm.utils.extensible_tensor import granule_size
    from vllm.v1.core.kv_cache_planning import finalize_extensible_kv_cache
    from vllm.v1.worker.extensible_kv_cache import (
        ExtensibleKVCache,
        kv_cache_export_handle_types,
        pad_kv_cache_segments,
        registers_kv_cache_memory,
    )
    from vllm.v1.worker.utils import allocate_kv_cache
    from vllm.v1.worker.worker_base import CompilationTimes

    from tests.gpu_handoff.host_vmm import DEVICE, host_vmm

    def plan(capacity: int, committed: int):
        return plan_engine(
            backend_name,
            kind,
            block_size,
            kv_cache_dtype,
            capacity,
            num_layers,
            model=model,
            kv_transfer_config=kv_transfer_config,
            num_shared_layers=num_shared_layers,
            tensor_parallel_size=1,
            layout=layout,
            extensible=True,
            max_model_blocks=committed,
        )

    with host_vmm():
        committed = committed_blocks or _committed_blocks(
            plan(2 * MIN_COMMITTED_BLOCKS, MIN_COMMITTED_BLOCKS)
        )
        engine = plan(capacity_blocks or 2 * committed, committed)
        vllm_config, resolved = engine.vllm_config, engine.layout
        registers = registers_kv_cache_memory(vllm_config)
        # GPUWorker.initialize_from_config: pads the segments; no connector yet.
        worker_config = pad_kv_cache_segments(
            copy.deepcopy(engine.engine_config),
            resolved,
            granule_size(DEVICE.index),
            registers_memory=registers,
        )
        # GPUModelRunner.initialize_kv_cache(extensible=True): reserve, view the reservation.
        runner_config = copy.deepcopy(worker_config)
        kv_cache = ExtensibleKVCache(
            runner_config,
            DEVICE,
            resolved,
            export_handle_types=kv_cache_export_handle_types(vllm_config),
        )
        kernel_block_sizes = runner_kernel_block_sizes(engine, runner_config)
        reserved_views = allocate_kv_cache(
            runner_config, DEVICE, resolved, kernel_block_sizes, allocate=kv_cache.allocate
        )
        # compile_or_warm_up_model: warm-up commits as it goes, is released to the minimum,
        # and the sizing steps commit again.
        kv_cache.commit(committed // 2)
        kv_cache.commit(kv_cache.min_committed_blocks, shrink=True)
        kv_cache.commit(committed // 2)
        # The engine core settles what the workers measured (its configs, the scheduler's too).
        measured = [CompilationTimes(language_model=0.0, encoder=0.0, num_kv_blocks=committed)]
        finalize_extensible_kv_cache(
            vllm_config, [engine.engine_config], engine.scheduler_config, measured
        )
        # extend_kv_cache, the steps that concern the connector.
        connector_config = copy.copy(worker_config)
        connector_config.num_blocks = committed
        connector_config.kv_cache_tensors = kv_cache.committed_kv_cache_tensors(
            connector_config, resolved, committed
        )
        kv_cache.commit(committed, defragment=registers, shrink=True)
        runner_config.num_blocks = kv_cache.num_committed_blocks
        views = kv_cache.committed_views(runner_config, resolved, kernel_block_sizes) or {}
    # bind_kv_caches aliases the KV-sharing layers into the committed views.
    for layer_name, target in engine.shared_layers.items():
        views[layer_name] = views[target]
    kv_caches = {name: views.get(name, view) for name, view in reserved_views.items()}
    return HandOff(
        kv_caches={**kv_caches, **views},
        kv_cache_config=connector_config,
        scheduler_kv_cache_config=engine.scheduler_config,
        runner_kv_cache_config=runner_config,
        vllm_config=vllm_config,
        layout=resolved.name,
        kernel_block_sizes=tuple(kernel_block_sizes),
        backend=engine.backend,
        kind=kind,
        kv_cache_dtype=kv_cache_dtype,
        shared_layers=engine.shared_layers,
        extensible_kv_cache=kv_cache,
    )


def committed_segment_bytes(handoff: HandOff) -> list[int]:
    """Each segment's committed bytes (what vLLM's segments_backed_by_one_chunk takes)."""
    kv_cache = handoff.extensible_kv_cache
    return [kv_cache.num_committed_blocks * stride for stride in kv_cache.segment_strides]


def free_extensible(handoff: HandOff) -> None:
    """Unmaps and releases the hand-off's memory: its views must not be used after this."""
    from tests.gpu_handoff.host_vmm import host_vmm

    with host_vmm():
        handoff.extensible_kv_cache.free()


def _committed_blocks(probe) -> int:
    """The fewest blocks (at least MIN_COMMITTED_BLOCKS) whose every segment stride spans
    COMMITTED_GRANULES granules: a segment's stride is a layer's page under layer-outer
    layouts, a block of every layer under block-outer ones (KVCacheTensor.block_stride)."""
    from tests.gpu_handoff.host_vmm import GRANULARITY

    stride = min(tensor.block_stride for tensor in probe.engine_config.kv_cache_tensors)
    return max(MIN_COMMITTED_BLOCKS, -(-COMMITTED_GRANULES * GRANULARITY // stride))
