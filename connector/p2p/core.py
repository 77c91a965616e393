"""P2PCore: the untraced P2P connector; builds the half for its role and delegates each hook."""

from typing import TYPE_CHECKING, Any

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
from kvscope.connector.common.stats_schema import IntervalReporter
from kvscope.connector.p2p import prom
from kvscope.connector.p2p.config import P2PConfig
from kvscope.connector.p2p.groups import P2PGroups
from kvscope.connector.p2p.metadata import P2PMetadata
from kvscope.connector.p2p.scheduler import P2PScheduler
from kvscope.connector.p2p.stats import P2PStats
from kvscope.connector.p2p.vllm_layout import preferred_layout, resolved_layout, tensor_strides
from kvscope.connector.p2p.worker import P2PWorker
from kvscope.traces.outcomes import outcome_of_policy

if TYPE_CHECKING:
    import torch
    from vllm.config import KVTransferConfig, VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.attention.backend import AttentionMetadata
    from vllm.v1.core.block_pool import BlockPool
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request


class P2PCore(KVConnectorBase_V1, SupportsHMA):
    """Prefill/decode over NIXL READs; use P2PConnector (traced). Every KV cache group of full
    or sliding-window attention moves (a sliding-window group only its window's blocks).

    Under tensor parallelism every worker rank holds its own shard of each block (its KV heads)
    and trades it only with the same rank of the peer engine, on its own side channel port.
    MLA's KV, the same on every rank (KVCacheConfig.kv_tp_replicas), moves the same way: once
    per decode rank, from the prefill rank of its number (so both engines need one TP size).
    """

    # vLLM's metrics split external hits by source; without this every pull counts as
    # 'external_unspecified'.
    _cache_hit_source = CacheHitSource.P2P

    def __init__(
        self, vllm_config: "VllmConfig", role: KVConnectorRole, kv_cache_config: "KVCacheConfig"
    ):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        ktc = self._kv_transfer_config
        config = P2PConfig.from_extra_config(ktc.kv_connector_extra_config)
        engine_id = str(ktc.engine_id)
        self.groups = P2PGroups.of(kv_cache_config)
        self.scheduler: P2PScheduler | None = None
        self.worker: P2PWorker | None = None
        self._reporter = IntervalReporter(P2PStats)
        self._handshake_metadata_seen = False
        if role == KVConnectorRole.SCHEDULER:
            self.scheduler = P2PScheduler(
                config, engine_id, vllm_config.cache_config.block_size, self.groups
            )
            self.scheduler.failure_outcome = outcome_of_policy(ktc.kv_load_failure_policy)
        else:
            serves = ktc.kv_role in ("kv_producer", "kv_both")
            tp_size = vllm_config.parallel_config.tensor_parallel_size
            self.worker = P2PWorker(
                config, engine_id, serves, ktc.kv_load_failure_policy, _tp_rank(tp_size), tp_size
            )

    def leave_failure_outcome_to_parent(self) -> None:
        """Inside a Multi, which says what a failed load became (a fallback, or the policy)."""
        if self.worker is not None:
            self.worker.failure_outcome = None
        if self.scheduler is not None:
            self.scheduler.refusal_outcome = None
            self.scheduler.failure_outcome = None

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config: "VllmConfig") -> str | None:
        """Asked by vLLM's resolve_kv_cache_layout, as it asks stock NIXL (vllm_layout)."""
        return preferred_layout(vllm_config)

    @classmethod
    def supports_sleep_mode(cls, kv_transfer_config: "KVTransferConfig") -> bool:
        """True: on sleep P2P revokes its loans, fails its reads and deregisters the KV cache;
        on wake it registers it again, and later leases name a new registration, so that
        readers handshake again rather than read the old pages."""
        return True

    @classmethod
    def kv_cache_access(cls, kv_transfer_config: "KVTransferConfig") -> "KVCacheAccess":
        """vLLM 0.34's question, answered as its NixlConnector does: the KV cache itself is
        registered with NIXL (one physical allocation per segment), and peers on the host map
        it through UCX cuda_ipc (FABRIC handles under the extensible KV cache)."""
        return KVCacheAccess.REGISTERS | KVCacheAccess.EXPORTS_FABRIC

    @classmethod
    def supports_lookahead_block_hashes(cls, kv_transfer_config: "KVTransferConfig") -> bool:
        """True: a pull reads the blocks the prefill side names, whatever their hashes."""
        return True

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config: dict[str, Any]) -> bool:
        """False: wait_for_layer_load and save_kv_layer do nothing (pulls start in
        start_load_kv, outside the captured graph), so FULL CUDA graphs skip nothing."""
        return False

    # --- scheduler side -----------------------------------------------------------------------

    def get_num_new_matched_tokens(self, request: "Request", num_computed_tokens: int):
        return self.scheduler.lookup(request, num_computed_tokens)

    def update_state_after_alloc(
        self, request: "Request", blocks: "KVCacheBlocks", num_external_tokens: int
    ):
        def is_null(group: int, index: int) -> bool:
            return blocks.blocks[group][index].is_null

        self.scheduler.bind(request, blocks.get_block_ids(), num_external_tokens, is_null)

    def get_loaded_kv_cache_group_ids(self, request: "Request") -> tuple[int, ...]:
        """A pull restores the request's own blocks of every group (as stock NIXL's)."""
        return self.groups.group_ids

    def bind_gpu_block_pool(self, gpu_block_pool: "BlockPool") -> None:
        if self.scheduler is not None:
            self.scheduler.null_block_id = gpu_block_pool.null_block.block_id

    def build_connector_meta(self, scheduler_output: "SchedulerOutput") -> KVConnectorMetadata:
        return self.scheduler.build_metadata()

    def update_connector_output(self, connector_output: "KVConnectorOutput") -> None:
        self.scheduler.on_worker_output(
            connector_output.kv_connector_worker_meta,
            connector_output.finished_sending or set(),
            connector_output.finished_recving or set(),
        )

    def request_finished(self, request: "Request", block_ids: list[int]):
        return self.scheduler.finished(request, (block_ids,))

    def request_finished_all_groups(self, request: "Request", block_ids: tuple[list[int], ...]):
        """Every group's blocks are held for the reader and freed together."""
        return self.scheduler.finished(request, tuple(block_ids))

    # --- worker side --------------------------------------------------------------------------

    def register_kv_caches(self, kv_caches: dict[str, "torch.Tensor"]) -> None:
        allow_amx()  # a decode side's first forward may be its first attention
        kv_cache_config = self._kv_cache_config
        kv_caches = distinct_kv_memories(kv_caches, kv_cache_config)
        self.worker.register(
            kv_caches,
            resolved_layout(self._vllm_config, kv_cache_config),
            getattr(kv_cache_config, "num_blocks", None),
            tensor_strides(kv_cache_config, list(kv_caches)),
        )

    def unregister_kv_caches(self) -> None:
        """vLLM (0.33+) lends the KV cache away, for sleep or (0.34) a weight update: reads
        into it fail and are recomputed, lent blocks are revoked, NIXL deregisters it."""
        if self.worker is not None:
            self.worker.unregister()

    def restore_kv_caches(self) -> None:
        """The KV cache is back: NIXL registers it again and the side channel serves it."""
        if self.worker is not None:
            self.worker.restore()

    def reset_cache(self) -> bool | None:
        """Nothing of P2P's to clear (None, as vLLM's default); a reset precedes sleep and a
        weight update's loan, so later leases name a new registration."""
        if self.scheduler is not None:
            self.scheduler.registration_may_change()
        return None

    def set_xfer_handshake_metadata(self, metadata: dict) -> None:
        """vLLM sends it at start and again after wake-up: later leases name a new registration
        (P2P's peers handshake over its own side channel, so the metadata itself is unused)."""
        if self.scheduler is not None:
            if self._handshake_metadata_seen:
                self.scheduler.registration_may_change()
            self._handshake_metadata_seen = True
        return None

    def start_load_kv(self, forward_context: "ForwardContext", **kwargs: Any) -> None:
        metadata = self._get_connector_metadata()
        assert isinstance(metadata, P2PMetadata), type(metadata)
        self.worker.start(metadata)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return None  # pulls are asynchronous: their requests are not in this forward

    def save_kv_layer(
        self,
        layer_name: str,
        kv_layer: "torch.Tensor",
        attn_metadata: "AttentionMetadata",
        **kwargs: Any,
    ) -> None:
        return None  # the decode side reads the blocks in place: nothing to save

    def wait_for_save(self) -> None:
        return None

    def get_finished(self, finished_req_ids: set[str]):
        results = self.get_transfer_results(finished_req_ids)
        return results.finished_sending or None, results.finished_recving or None

    def get_transfer_results(self, finished_req_ids: set[str]) -> KVConnectorTransferResults:
        """With several KV cache groups a failed pull is reported by request (failed_recving):
        vLLM cannot map block ids, which are per group, back to requests."""
        sending, recving = self.worker.poll()
        failed = self.worker.take_failed_loads()
        return KVConnectorTransferResults(sending, recving, failed if self.groups.multi else set())

    def get_block_ids_with_load_errors(self) -> set[int]:
        errors = self.worker.take_load_errors()
        return set() if self.groups.multi else errors

    def build_connector_worker_meta(self):
        return self.worker.take_worker_meta()

    # --- stats and metrics ----------------------------------------------------------------

    def get_kv_connector_stats(self) -> P2PStats | None:
        """What changed since the last call (the halves keep cumulative counters); vLLM sums
        the workers' over ranks and adds the scheduler half's."""
        if self.worker is not None:
            counters, samples = self.worker.report_values()
            return self._reporter.report(counters, {}, samples)
        counters, gauges = self.scheduler.report_values()
        return self._reporter.report(counters, gauges, self.scheduler.samples)

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> P2PStats:
        return P2PStats(data=data or {})

    @classmethod
    def build_prom_metrics(cls, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        return prom.P2PPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    def held(self) -> dict[str, object]:
        """What this role's half still holds (its held()); all falsy when it holds nothing."""
        half = self.scheduler if self.scheduler is not None else self.worker
        return half.held() if half is not None else {}

    def shutdown(self) -> None:
        if self.worker is not None:
            self.worker.shutdown()


def _tp_rank(tp_size: int) -> int:
    """This worker's tensor-parallel rank (vLLM builds worker connectors after its TP group)."""
    if tp_size == 1:
        return 0
    from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

    return get_tensor_model_parallel_rank()
