"""MultiCore: the untraced MultiConnector; the halves do the work, each hook is one line here."""

from typing import TYPE_CHECKING, Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorRole,
    SupportsHMA,
)

from kvscope.connector.multi import answers, class_level, stats
from kvscope.connector.multi.children import build_children
from kvscope.connector.multi.groups import num_groups
from kvscope.connector.multi.metadata import MultiMetadata
from kvscope.connector.multi.scheduler import MultiScheduler
from kvscope.connector.multi.worker import MultiWorker

if TYPE_CHECKING:
    import torch
    from vllm.config import KVTransferConfig, VllmConfig
    from vllm.distributed.kv_transfer.kv_connector.v1.base import CopyBlocksOp
    from vllm.forward_context import ForwardContext
    from vllm.v1.attention.backend import AttentionMetadata
    from vllm.v1.core.block_pool import BlockPool
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks, KVCacheManager
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request


class MultiCore(KVConnectorBase_V1, SupportsHMA):
    """Composes the connectors listed in extra config; use KvscopeMultiConnector (traced).

    SupportsHMA: every child gets each KV cache group's block ids. With several groups every
    child must be SupportsHMA too, else it refuses to start naming those that are not; with
    one group any child works.
    """

    def __init__(
        self, vllm_config: "VllmConfig", role: KVConnectorRole, kv_cache_config: "KVCacheConfig"
    ):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        outer = self._kv_transfer_config
        extra = outer.kv_connector_extra_config or {}
        fallback = bool(extra.get("fallback", True))
        groups = num_groups(kv_cache_config)
        if groups > 1:  # asked of the classes, before any child starts (a NIXL agent, a pool)
            class_level.refuse_children_without_hma(outer, groups)
        self.children = build_children(vllm_config, role, kv_cache_config)
        # vLLM gathers every rank's worker output (TP x PP): loads end when all of them did.
        world_size = vllm_config.parallel_config.world_size
        self.scheduler = MultiScheduler(
            self.children,
            vllm_config.cache_config.block_size,
            fallback,
            str(self._kv_transfer_config.engine_id),
            self._kv_transfer_config.kv_load_failure_policy,
            world_size,
            groups,
        )
        self.worker = MultiWorker(self.children, fallback, world_size, groups)

    @property
    def _connectors(self) -> list[KVConnectorBase_V1]:
        """The children, where vLLM looks for them in its own MultiConnector (vLLM's
        _find_simple_cpu_offload_connector walks this)."""
        return [child.connector for child in self.children]

    def _each(self, method: str, *args: Any) -> list[Any]:
        return [getattr(child.connector, method)(*args) for child in self.children]

    # --- scheduler side -----------------------------------------------------------------------

    def get_num_new_matched_tokens(self, request: "Request", num_computed_tokens: int):
        tokens, is_async, _ = self.scheduler.lookup(request, num_computed_tokens)
        return tokens, is_async

    def update_state_after_alloc(
        self, request: "Request", blocks: "KVCacheBlocks", num_external_tokens: int
    ):
        self.scheduler.bind(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output: "SchedulerOutput") -> MultiMetadata:
        return self.scheduler.build_metadata(scheduler_output)

    def update_connector_output(self, connector_output: "KVConnectorOutput") -> None:
        self.scheduler.on_worker_output(connector_output)

    def request_finished(self, request: "Request", block_ids: list[int]):
        return self.scheduler.finished(request, (block_ids,), all_groups=False)

    def request_finished_all_groups(self, request: "Request", block_ids: tuple[list[int], ...]):
        return self.scheduler.finished(request, tuple(block_ids), all_groups=True)

    def on_new_request(self, request: "Request") -> None:
        self._each("on_new_request", request)

    def may_load_async(self, request: "Request") -> bool:
        """vLLM 0.34: when any child may load the request asynchronously (as vLLM's
        MultiConnector): the lookup may pick that child."""
        return any(child.connector.may_load_async(request) for child in self.children)

    def _serving(self, request: "Request") -> KVConnectorBase_V1 | None:
        """The child chosen to load the request's external hit, if any."""
        serving = self.scheduler.serving.get(str(request.request_id))
        return None if serving is None else self.children[serving].connector

    def get_external_cache_hit_sources(self, request: "Request", num_external_tokens: int):
        if (child := self._serving(request)) is None:
            return super().get_external_cache_hit_sources(request, num_external_tokens)
        return child.get_external_cache_hit_sources(request, num_external_tokens)

    def get_loaded_kv_cache_group_ids(self, request: "Request") -> tuple[int, ...]:
        if (child := self._serving(request)) is None:
            return super().get_loaded_kv_cache_group_ids(request)
        return child.get_loaded_kv_cache_group_ids(request)

    def register_finished_partial_tail(
        self,
        request: "Request",
        block_ids: tuple[list[int], ...],
        partial_tail_offloads: list[tuple[int, int, int]],
    ) -> bool:
        accepted = self._each(
            "register_finished_partial_tail", request, block_ids, partial_tail_offloads
        )
        return any(accepted)

    def bind_kv_cache_manager(self, kv_cache_manager: "KVCacheManager") -> None:
        self._kv_cache_manager = kv_cache_manager
        self._each("bind_kv_cache_manager", kv_cache_manager)

    def bind_gpu_block_pool(self, gpu_block_pool: "BlockPool") -> None:
        self._each("bind_gpu_block_pool", gpu_block_pool)

    def set_xfer_handshake_metadata(self, metadata: dict) -> None:
        """Every child gets the workers' handshake metadata (NixlConnector starts its side
        channel listener with it), as in vLLM's MultiConnector."""
        self._each("set_xfer_handshake_metadata", metadata)

    def set_xfer_handshake_metadata_pp_aware(self, metadata: dict) -> None:
        self._each("set_xfer_handshake_metadata_pp_aware", metadata)

    @property
    def requires_kv_delivery(self) -> bool:
        return any(child.connector.requires_kv_delivery for child in self.children)

    @property
    def supports_divergent_local_hybrid_hits(self) -> bool:
        """Only when every child can complete a divergent local hybrid hit: the scheduler asks
        before it knows which child will serve the request (as vLLM's MultiConnector)."""
        return bool(self.children) and all(
            child.connector.supports_divergent_local_hybrid_hits for child in self.children
        )

    def take_events(self):
        return [event for events in self._each("take_events") for event in events]

    def has_pending_block_frees(self) -> bool:
        return any(self._each("has_pending_block_frees"))

    def has_pending_push_work(self) -> bool:
        return any(self._each("has_pending_push_work"))

    def reset_cache(self) -> bool | None:
        return answers.reset_cache(self._each("reset_cache"))

    # --- worker side --------------------------------------------------------------------------

    def register_kv_caches(self, kv_caches: dict[str, "torch.Tensor"]) -> None:
        self._each("register_kv_caches", kv_caches)

    def bind_connector_metadata(self, connector_metadata: MultiMetadata) -> None:
        super().bind_connector_metadata(connector_metadata)
        self.worker.bind(connector_metadata)

    def clear_connector_metadata(self) -> None:
        super().clear_connector_metadata()
        self._each("clear_connector_metadata")

    def handle_preemptions(self, kv_connector_metadata: MultiMetadata) -> None:
        for child, metadata in zip(self.children, kv_connector_metadata.children, strict=True):
            child.connector.handle_preemptions(metadata)

    def start_load_kv(self, forward_context: "ForwardContext", **kwargs: Any) -> None:
        for index, child in enumerate(self.children):
            with self.scheduler.span(index, "start_load_kv"):
                child.connector.start_load_kv(forward_context, **kwargs)

    def wait_for_layer_load(self, layer_name: str) -> None:
        self._each("wait_for_layer_load", layer_name)

    def save_kv_layer(
        self,
        layer_name: str,
        kv_layer: "torch.Tensor",
        attn_metadata: "AttentionMetadata",
        **kwargs: Any,
    ) -> None:
        for child in self.children:
            child.connector.save_kv_layer(layer_name, kv_layer, attn_metadata, **kwargs)

    def wait_for_save(self) -> None:
        for index, child in enumerate(self.children):
            with self.scheduler.span(index, "wait_for_save"):
                child.connector.wait_for_save()

    def get_transfer_results(self, finished_req_ids: set[str]):
        return self.worker.transfer_results(finished_req_ids)

    def get_finished(self, finished_req_ids: set[str]):
        results = self.get_transfer_results(finished_req_ids)
        return results.finished_sending or None, results.finished_recving or None

    def get_block_ids_with_load_errors(self) -> set[int]:
        return self.worker.take_load_errors()

    def build_connector_worker_meta(self):
        return self.worker.worker_meta()

    def get_handshake_metadata(self):
        return answers.handshake_metadata(self._each("get_handshake_metadata"))

    def get_finished_count(self) -> int | None:
        return answers.finished_count(self._each("get_finished_count"))

    def set_host_xfer_buffer_ops(self, copy_operation: "CopyBlocksOp") -> None:
        self._each("set_host_xfer_buffer_ops", copy_operation)

    def get_mem_pool_context(self):
        return answers.mem_pool_context(self.children, self._each("get_mem_pool_context"))

    def finish_forward(self) -> None:
        self._each("finish_forward")

    def reset_capture_state(self) -> None:
        self._each("reset_capture_state")

    def get_kv_connector_stats(self) -> stats.MultiStats | None:
        return answers.kv_connector_stats(self.children, self._each("get_kv_connector_stats"))

    def get_kv_connector_kv_cache_events(self):
        return answers.kv_cache_events(self._each("get_kv_connector_kv_cache_events"))

    def held(self) -> dict[str, object]:
        """What the Multi's half for this role still holds (its held()), not its children's:
        each child's core answers for itself."""
        if self._role == KVConnectorRole.SCHEDULER:
            return self.scheduler.held()
        return self.worker.held()

    def shutdown(self) -> None:
        self._each("shutdown")

    def unregister_kv_caches(self) -> None:
        """vLLM 0.33's sleep: every child drops its registrations (one written for 0.32 has
        no such hook and nothing to drop)."""
        self._each_that_has("unregister_kv_caches")

    def restore_kv_caches(self) -> None:
        """vLLM 0.33's wake-up: every child registers its KV caches again."""
        self._each_that_has("restore_kv_caches")

    def _each_that_has(self, method: str) -> None:
        for child in self.children:
            if (call := getattr(child.connector, method, None)) is not None:
                call()

    # --- class-level questions (vLLM asks them before any connector exists) ----------------

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config: "VllmConfig") -> str | None:
        return class_level.required_kvcache_layout(vllm_config)

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config: dict[str, Any]) -> bool:
        return class_level.requires_piecewise_for_cudagraph(extra_config)

    @classmethod
    def supports_sleep_mode(cls, kv_transfer_config: "KVTransferConfig") -> bool:
        return class_level.supports_sleep_mode(kv_transfer_config)

    @classmethod
    def kv_cache_access(cls, kv_transfer_config: "KVTransferConfig") -> Any:
        return class_level.kv_cache_access(kv_transfer_config)

    @classmethod
    def supports_lookahead_block_hashes(cls, kv_transfer_config: "KVTransferConfig") -> bool:
        return class_level.supports_lookahead_block_hashes(kv_transfer_config)

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> stats.MultiStats:
        return stats.rebuild_stats(data)

    @classmethod
    def build_prom_metrics(cls, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        return stats.build_prom_metrics(
            vllm_config, metric_types, labelnames, per_engine_labelvalues
        )
