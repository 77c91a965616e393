"""InstrumentedConnector: a KV connector that traces every hook of the connector it wraps."""

import copy
import os
from typing import TYPE_CHECKING, Any, Final, cast

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorRole,
    supports_hma,
)

from kvscope.connector.common.kv_cache_access import lookahead_hashing
from kvscope.traces.forwarding import install_forwarders
from kvscope.traces.hook_spans import HookSpans
from kvscope.traces.scheduler_hooks import SchedulerHooks
from kvscope.traces.scheduler_spans import SchedulerTracing
from kvscope.traces.worker_hooks import WorkerHooks
from kvscope.traces.worker_spans import WorkerTracing

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.config.kv_transfer import KVTransferConfig

    from kvscope.traces.hook_host import KvCacheAccessClass

EXTRA_LAYER_MODE: Final = "trace_layer_mode"
"""kv_connector_extra_config key: 'aggregated' (default) or 'per_layer' spans for layer hooks."""

EXTRA_QUIET_HOOKS: Final = "trace_quiet_hooks"
"""kv_connector_extra_config key: True gives per-step queries a span even when idle."""

NO_OP_BY_DEFAULT: Final = (
    "handle_preemptions",
    "get_block_ids_with_load_errors",
    "get_kv_connector_stats",
    "get_kv_connector_kv_cache_events",
    "build_connector_worker_meta",
    "take_events",
)
"""Traced hooks whose KVConnectorBase_V1 versions do nothing: a wrapped connector that keeps
those runs them without a span, since a span could only say that vLLM called them."""


def layer_span_mode(extra_config: dict[str, Any]) -> str:
    """'per_layer' or 'aggregated': the extra config's, else KVSCOPE_LAYER_SPANS's."""
    return extra_config.get(EXTRA_LAYER_MODE) or os.environ.get("KVSCOPE_LAYER_SPANS", "aggregated")


def reports_facts(connector_type: type) -> bool:
    """Whether a connector may report facts (blocks, leases, failures) through traces.events:
    any but vLLM's own, which know nothing of kvscope."""
    return not connector_type.__module__.startswith("vllm.")


class InstrumentedConnector(SchedulerHooks, WorkerHooks, KVConnectorBase_V1):
    """Delegates every hook to an inner connector inside an OpenTelemetry span.

    Subclasses say how to build the inner connector (`build_inner`) and which class it is
    (`inner_class`). The hook's behaviour never changes: arguments and return values pass
    through, and exceptions are recorded on the span and re-raised unchanged.
    """

    def __init__(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        from kvscope.traces.sdk.configure import configure_tracing

        ktc = self._kv_transfer_config
        role_name = "scheduler" if role == KVConnectorRole.SCHEDULER else "worker"
        configure_tracing(service_name=f"kvscope-{ktc.kv_role or 'engine'}")
        self._inner: KVConnectorBase_V1 = self.build_inner(vllm_config, role, kv_cache_config)
        # vLLM decides from our class, before any connector exists, whether it may enable the
        # hybrid KV cache manager: a SupportsHMA wrapper given several KV cache groups must
        # wrap a connector that is SupportsHMA too.
        self._inner_supports_hma = supports_hma(self._inner)
        num_groups = len(getattr(kv_cache_config, "kv_cache_groups", None) or ())
        if supports_hma(self) and not self._inner_supports_hma and num_groups > 1:
            raise ValueError(
                f"{type(self._inner).__name__} does not support vLLM's hybrid KV cache manager "
                f"and this model has {num_groups} KV cache groups: start vLLM with "
                "--disable-hybrid-kv-cache-manager"
            )
        extra = ktc.kv_connector_extra_config or {}
        layer_mode = layer_span_mode(extra)
        self._trace_quiet_hooks = bool(extra.get(EXTRA_QUIET_HOOKS, False))
        self._failure_policy = ktc.kv_load_failure_policy
        inner_type = type(self._inner)
        self._spans = HookSpans(
            inner_type.__name__,
            role_name,
            str(ktc.engine_id),
            str(ktc.kv_role),
            reports=reports_facts(inner_type),
        )
        self._sched = SchedulerTracing(self._spans)
        self._work = WorkerTracing(self._spans, per_layer=layer_mode == "per_layer")
        self._untraced = self.untraced_hooks()
        # A quiet step (no KV work: most decode steps) runs the per-step hooks bare, each
        # checking this flag first (WorkerHooks.bind_connector_metadata sets it).
        self._quiet_step = False

    def untraced_hooks(self) -> frozenset[str]:
        """The NO_OP_BY_DEFAULT hooks the wrapped connector leaves to vLLM's base class: they
        run without a span (unless quiet hooks are traced)."""
        if self._trace_quiet_hooks:
            return frozenset()
        inner_type = type(self._inner)
        return frozenset(
            name
            for name in NO_OP_BY_DEFAULT
            if getattr(inner_type, name) is getattr(KVConnectorBase_V1, name)
        )

    # --- what subclasses provide --------------------------------------------------------------

    def build_inner(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any):
        raise NotImplementedError

    @classmethod
    def inner_class(cls, extra_config: dict[str, Any]) -> type[KVConnectorBase_V1]:
        """The wrapped class, from the outer kv_connector_extra_config."""
        raise NotImplementedError

    @classmethod
    def inner_transfer_config(cls, kv_transfer_config: "KVTransferConfig") -> "KVTransferConfig":
        """The wrapped connector's KVTransferConfig: the same, unless a subclass says otherwise."""
        return kv_transfer_config

    @classmethod
    def inner_vllm_config(cls, vllm_config: "VllmConfig") -> "VllmConfig":
        outer = vllm_config.kv_transfer_config
        if outer is None:  # no connector configured: nothing to hand on
            return vllm_config
        inner = cls.inner_transfer_config(outer)
        if inner is outer:
            return vllm_config
        inner_config = copy.copy(vllm_config)
        inner_config.kv_transfer_config = inner
        return inner_config

    # --- class-level questions vLLM asks before building connectors --------------------------

    @classmethod
    def _inner_class_of(cls, vllm_config: Any) -> type[KVConnectorBase_V1]:
        return cls._inner_class_of_transfer(vllm_config.kv_transfer_config)

    @classmethod
    def _inner_class_of_transfer(cls, kv_transfer_config: "KVTransferConfig") -> type:
        return cls.inner_class(kv_transfer_config.kv_connector_extra_config or {})

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config: Any) -> str | None:
        inner = cls._inner_class_of(vllm_config)
        return inner.get_required_kvcache_layout(cls.inner_vllm_config(vllm_config))

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config: dict[str, Any]) -> bool:
        """What the wrapped connector needs, and True for per-layer spans.

        FULL CUDA graphs replay the forward without calling the per-layer hooks. A per-layer
        span is what the user asked to see, so that mode needs PIECEWISE graphs; aggregated
        mode only times the calls vLLM makes (none are missing from what the wrapped connector
        itself would get), so it asks for nothing the wrapped connector does not.
        """
        if layer_span_mode(extra_config) == "per_layer":
            return True
        inner_extra = cls.inner_extra_config(extra_config)
        return cls.inner_class(extra_config).requires_piecewise_for_cudagraph(inner_extra)

    @classmethod
    def inner_extra_config(cls, extra_config: dict[str, Any]) -> dict[str, Any]:
        """The inner connector's own kv_connector_extra_config."""
        return {
            k: v for k, v in extra_config.items() if k not in (EXTRA_LAYER_MODE, EXTRA_QUIET_HOOKS)
        }

    @classmethod
    def build_prom_metrics(cls, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        return cls._inner_class_of(vllm_config).build_prom_metrics(
            cls.inner_vllm_config(vllm_config), metric_types, labelnames, per_engine_labelvalues
        )

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None):
        """The wrapped class rebuilds its own stats (vLLM's logger asks the configured class):
        for a wrapper whose inner class needs no config to be known (kvscope's own)."""
        return cls.inner_class({}).build_kv_connector_stats(data)

    @classmethod
    def supports_sleep_mode(cls, kv_transfer_config: "KVTransferConfig") -> bool:
        """vLLM 0.33's question (sleep mode on): the wrapped class's answer; a class written for
        0.32 has none, and 0.33's default is True."""
        inner = cls._inner_class_of_transfer(kv_transfer_config)
        ask = getattr(inner, "supports_sleep_mode", None)
        return True if ask is None else ask(cls.inner_transfer_config(kv_transfer_config))

    @classmethod
    def kv_cache_access(cls, kv_transfer_config: "KVTransferConfig") -> Any:
        """vLLM 0.34's question (how the extensible KV cache allocates): the wrapped class's
        KVCacheAccess, so a connector that registers the cache keeps one allocation a segment."""
        inner = cast("KvCacheAccessClass", cls._inner_class_of_transfer(kv_transfer_config))
        return inner.kv_cache_access(cls.inner_transfer_config(kv_transfer_config))

    @classmethod
    def supports_lookahead_block_hashes(cls, kv_transfer_config: "KVTransferConfig") -> bool:
        """vLLM 0.34's question (EAGLE's block drop): the wrapped class's answer, so that a
        traced engine hashes its blocks as the bare one does."""
        inner = cls._inner_class_of_transfer(kv_transfer_config)
        return lookahead_hashing(inner, cls.inner_transfer_config(kv_transfer_config))

    # --- lifecycle shared by both roles -------------------------------------------------------

    @property
    def inner(self) -> KVConnectorBase_V1:
        return self._inner

    @property
    def _connectors(self) -> list[KVConnectorBase_V1]:
        """What vLLM walks to find a stock connector inside another (as in its MultiConnector):
        _find_simple_cpu_offload_connector, whose answer aligns the CPU pools of all ranks."""
        return [self._inner]

    def set_xfer_handshake_metadata(self, metadata) -> None:
        with self._spans.hook("set_xfer_handshake_metadata"):
            return self._inner.set_xfer_handshake_metadata(metadata)

    def set_xfer_handshake_metadata_pp_aware(self, metadata) -> None:
        with self._spans.hook("set_xfer_handshake_metadata"):
            return self._inner.set_xfer_handshake_metadata_pp_aware(metadata)

    def shutdown(self):
        with self._spans.hook("shutdown"):
            result = self._inner.shutdown()
        self._work.end_step()
        self._sched.end_all()
        from kvscope.traces.sdk.configure import flush

        flush(timeout_s=5)
        return result


# Every instance member of vLLM's connector API that the hooks above leave to the base class
# (bookkeeping queries and plumbing, not lifecycle events) goes to the wrapped connector as is.
FORWARDED: Final = install_forwarders(InstrumentedConnector)
"""What InstrumentedConnector forwards untraced, derived from vLLM's KVConnectorBase_V1."""
