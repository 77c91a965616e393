"""CpuOffloadCore: the untraced connector; builds the half for its role and delegates each hook."""

from typing import TYPE_CHECKING, Any, Final

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    KVConnectorTransferResults,
    SupportsHMA,
)
from vllm.v1.metrics.cache_hit_source import CacheHitSource

from kvscope.connector.common.cpu_amx import allow_amx
from kvscope.connector.common.kv_cache_access import KVCacheAccess
from kvscope.connector.common.kv_layout import distinct_kv_memories
from kvscope.connector.cpu_offload import prom
from kvscope.connector.cpu_offload.config import OffloadConfig
from kvscope.connector.cpu_offload.faults import FaultInjector
from kvscope.connector.cpu_offload.groups import KVGroups, layers_per_block
from kvscope.connector.cpu_offload.hits import holds_last_loadable_block
from kvscope.connector.cpu_offload.host_pool import KVNamespace, num_host_blocks
from kvscope.connector.cpu_offload.layout import preferred_layout
from kvscope.connector.cpu_offload.metadata import OffloadMetadata
from kvscope.connector.cpu_offload.replicas import ReplicaGroup
from kvscope.connector.cpu_offload.scheduler import OffloadScheduler
from kvscope.connector.cpu_offload.shared_loads import SharedLoads
from kvscope.connector.cpu_offload.stats import IntervalReporter, OffloadStats
from kvscope.connector.cpu_offload.worker import OffloadWorker
from kvscope.traces.outcomes import outcome_of_policy

if TYPE_CHECKING:
    from vllm.config import KVTransferConfig, VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.attention.backend import AttentionMetadata
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import AttentionSpec, KVCacheConfig
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request

SLEEP_DRAIN_TIMEOUT_S: Final = 30.0
"""How long unregister_kv_caches lets a copy run before cancelling it (and waiting for it)."""


class CpuOffloadCore(KVConnectorBase_V1, SupportsHMA):
    """Keeps KV blocks in a host pool keyed by content and KV cache group; use
    CpuOffloadConnector (traced). Every group of full or sliding-window attention is kept."""

    _cache_hit_source = CacheHitSource.HOST

    def __init__(
        self, vllm_config: "VllmConfig", role: KVConnectorRole, kv_cache_config: "KVCacheConfig"
    ):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        extra = self._kv_transfer_config.kv_connector_extra_config or {}
        config = OffloadConfig.from_extra_config(extra)
        faults = FaultInjector.from_extra_config(extra)
        self.scheduler: OffloadScheduler | None = None
        self.worker: OffloadWorker | None = None
        self._reporter = IntervalReporter(OffloadStats)
        # vLLM gathers every rank's worker output (TP x PP), not only the TP group's.
        world_size = vllm_config.parallel_config.world_size
        self.groups = KVGroups.of(kv_cache_config)
        replicas = ReplicaGroup.of(vllm_config, kv_cache_config)  # MLA's TP ranks share a pool
        if role == KVConnectorRole.SCHEDULER:
            spec = kv_cache_config.kv_cache_groups[self.groups.groups[0].group_id].kv_cache_spec
            num_layers = layers_per_block(kv_cache_config)
            host_blocks = num_host_blocks(
                config.bytes_per_rank(world_size, replicas.size), spec.page_size_bytes * num_layers
            )
            self.scheduler = OffloadScheduler(
                config,
                kv_namespace(vllm_config, spec, num_layers),
                spec.block_size,
                host_blocks,
                world_size,
                faults,
                kv_events_enabled(vllm_config),
                self.groups,
            )
            self.scheduler.failure_outcome = outcome_of_policy(
                self._kv_transfer_config.kv_load_failure_policy
            )
            self.scheduler.health.engine_id = str(self._kv_transfer_config.engine_id)
            self.shared_loads = SharedLoads.of(self.scheduler, vllm_config)
        else:
            faults.rank = world_rank()
            policy = self._kv_transfer_config.kv_load_failure_policy
            self.worker = OffloadWorker(
                config, faults, kv_cache_config.num_blocks, policy, world_size, replicas
            )

    def leave_failure_outcome_to_parent(self) -> None:
        """Inside a Multi, which says what a failed load became (a fallback, or the policy)."""
        if self.worker is not None:
            self.worker.failure_outcome = None
        if self.scheduler is not None:
            self.scheduler.failure_outcome = "left_to_parent"

    # --- scheduler side -----------------------------------------------------------------------

    def get_num_new_matched_tokens(
        self, request: "Request", num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        return self.shared_loads.lookup(request, num_computed_tokens)

    def update_state_after_alloc(
        self, request: "Request", blocks: "KVCacheBlocks", num_external_tokens: int
    ) -> None:
        self.scheduler.bind(request, blocks.get_block_ids(), num_external_tokens)

    def build_connector_meta(self, scheduler_output: "SchedulerOutput") -> KVConnectorMetadata:
        return self.scheduler.build_metadata(scheduler_output, self._kv_cache_manager)

    def may_load_async(self, request: "Request") -> bool:
        """vLLM 0.34 (--max-num-inflight-kv-loads): every hit loads asynchronously, so True
        when the pool holds the last block a hit could load."""
        scheduler = self.scheduler
        return holds_last_loadable_block(
            scheduler.pool,
            self.groups,
            scheduler.namespace,
            request.block_hashes,
            request.num_prompt_tokens,
            scheduler.block_size,
        )

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config: dict[str, Any]) -> bool:
        """False: wait_for_layer_load and save_kv_layer do nothing. Every copy is queued in
        start_load_kv and wait_for_save, which vLLM calls outside the captured graph, so FULL
        CUDA graphs skip nothing this connector needs."""
        return False

    @property
    def requires_kv_delivery(self) -> bool:
        return False  # a best-effort cache: a store dropped by a preemption is a later miss

    def update_connector_output(self, connector_output: "KVConnectorOutput") -> None:
        self.scheduler.on_worker_output(connector_output.kv_connector_worker_meta)

    def request_finished(
        self, request: "Request", block_ids: list[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        return self.scheduler.finished(request), None

    def request_finished_all_groups(
        self, request: "Request", block_ids: tuple[list[int], ...]
    ) -> tuple[bool, dict[str, Any] | None]:
        """Blocks of every group are freed together: one answer covers them all."""
        return self.scheduler.finished(request), None

    # --- worker side --------------------------------------------------------------------------

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        allow_amx()  # a whole prompt loaded: the first forward may be the first attention
        self.worker.register(distinct_kv_memories(kv_caches, self._kv_cache_config))

    def unregister_kv_caches(self) -> None:
        """vLLM 0.33's sleep mode, before it unmaps the KV cache: every copy ends, none starts."""
        self.worker.sleep(SLEEP_DRAIN_TIMEOUT_S)

    def restore_kv_caches(self) -> None:
        """After wake-up: the KV cache is mapped back at the same addresses; copies may run."""
        self.worker.wake_up()

    @classmethod
    def supports_sleep_mode(cls, kv_transfer_config: "KVTransferConfig") -> bool:
        """True: unregister_kv_caches drains the copies and restore_kv_caches re-arms them."""
        return True

    @classmethod
    def kv_cache_access(cls, kv_transfer_config: "KVTransferConfig") -> "KVCacheAccess":
        """vLLM 0.34's question: IN_PROCESS, since the copies are torch copies in the worker's
        own process (only the host pool is registered, with CUDA), so any allocation serves."""
        return KVCacheAccess.IN_PROCESS

    @classmethod
    def supports_lookahead_block_hashes(cls, kv_transfer_config: "KVTransferConfig") -> bool:
        """True: the pool keys and KV events are vLLM's block hashes, lookahead tokens and
        all, and lookups and stores take only the blocks that have one."""
        return True

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config: "VllmConfig") -> str | None:
        return preferred_layout(vllm_config)

    @classmethod
    def yields_kv_cache_layout(cls) -> bool:
        """True: the copies serve any layout, so beside a connector that needs another one
        (P2P's BLNHC in a Multi) this preference should give way rather than refuse."""
        return True

    def start_load_kv(self, forward_context: "ForwardContext", **kwargs: Any) -> None:
        self.worker.start_loads(self._metadata())

    def wait_for_layer_load(self, layer_name: str) -> None:
        return None  # loads are asynchronous: their requests are not in this forward

    def save_kv_layer(
        self,
        layer_name: str,
        kv_layer: torch.Tensor,
        attn_metadata: "AttentionMetadata",
        **kwargs: Any,
    ) -> None:
        return None  # whole blocks are stored after the forward, in wait_for_save

    def wait_for_save(self) -> None:
        self.worker.start_stores(self._metadata())

    def handle_preemptions(self, kv_connector_metadata: KVConnectorMetadata) -> None:
        assert isinstance(kv_connector_metadata, OffloadMetadata), type(kv_connector_metadata)
        self.worker.wait_for_stores(kv_connector_metadata.reqs_preempted)

    def get_finished(self, finished_req_ids: set[str]):
        results = self.get_transfer_results(finished_req_ids)
        return results.finished_sending or None, results.finished_recving or None

    def get_transfer_results(self, finished_req_ids: set[str]) -> KVConnectorTransferResults:
        """With several KV cache groups a failed load is reported by request (failed_recving):
        vLLM cannot map block ids, which are per group, back to requests."""
        sending, recving = self.worker.poll()
        failed = self.worker.take_failed_loads()
        return KVConnectorTransferResults(sending, recving, failed if self.groups.multi else set())

    def get_block_ids_with_load_errors(self) -> set[int]:
        errors = self.worker.take_load_errors()
        return set() if self.groups.multi else errors

    def build_connector_worker_meta(self):
        return self.worker.take_worker_meta()

    def reset_cache(self) -> bool | None:
        return self.scheduler.reset_cache() if self.scheduler is not None else None

    def take_events(self):
        """The host tier's BlockStored / BlockRemoved events, for vLLM's KV event publisher."""
        return self.scheduler.kv_events.take() if self.scheduler is not None else []

    def get_kv_connector_stats(self):
        """What changed since the last call (the halves keep cumulative counters); vLLM sums
        the workers' over ranks and adds the scheduler half's."""
        if self.worker is not None:
            return self._reporter.report(self.worker.stats.as_dict(), {}, self.worker.samples)
        counters, gauges = self.scheduler.report_values()
        return self._reporter.report(counters, gauges, self.scheduler.samples)

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None):
        return OffloadStats(data=data or {})

    @classmethod
    def build_prom_metrics(cls, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        return prom.OffloadPromMetrics(
            vllm_config, metric_types, labelnames, per_engine_labelvalues
        )

    def held(self) -> dict[str, object]:
        """What this role's half still holds (its held()); all falsy when it holds nothing."""
        half = self.scheduler if self.scheduler is not None else self.worker
        return half.held() if half is not None else {}

    def shutdown(self) -> None:
        if self.worker is not None:
            self.worker.shutdown()

    def _metadata(self) -> OffloadMetadata:
        metadata = self._get_connector_metadata()
        assert isinstance(metadata, OffloadMetadata), type(metadata)
        return metadata


def kv_events_enabled(vllm_config: "VllmConfig") -> bool:
    """Whether vLLM publishes KV events (--kv-events-config): the host tier's are kept only then."""
    events = getattr(vllm_config, "kv_events_config", None)
    return bool(events is not None and events.enable_kv_cache_events)


def world_rank() -> int:
    """This worker's rank among all the engine's workers (TP x PP)."""
    from vllm.distributed.parallel_state import get_world_group

    try:
        return get_world_group().rank_in_group
    except AssertionError:  # no distributed set-up: a lone worker built outside vLLM
        return 0


def kv_namespace(vllm_config: "VllmConfig", spec: "AttentionSpec", num_layers: int) -> KVNamespace:
    """What makes KV incompatible; every worker holds its own tensor-parallel shard of a block."""
    from vllm.platforms import current_platform

    parallel = vllm_config.parallel_config
    return KVNamespace(
        model=str(vllm_config.model_config.model),
        dtype=str(spec.dtype),
        kv_layout=current_platform.device_type,
        block_size=spec.block_size,
        tp_rank=0,
        tp_size=parallel.tensor_parallel_size,
        num_layers=num_layers,
        num_kv_heads=spec.num_kv_heads,
        head_dim=spec.head_size,
    )
