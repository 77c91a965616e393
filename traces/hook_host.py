"""What the hook mixins (SchedulerHooks, WorkerHooks) need from the connector that hosts them,
and the members of vLLM 0.34's connector API that older releases (the one installed) lack.

Read by the type checker only: each mixin names ConnectorHost as its base under TYPE_CHECKING
and stays a plain mixin at run time, so that InstrumentedConnector's MRO is what it always was.
InstrumentedConnector.__init__ sets every attribute declared here.
"""

from typing import TYPE_CHECKING, Any, Protocol

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1

from kvscope.traces.hook_spans import HookSpans
from kvscope.traces.scheduler_spans import SchedulerTracing
from kvscope.traces.worker_spans import WorkerTracing

if TYPE_CHECKING:
    from vllm.config.kv_transfer import KVTransferConfig


class ConnectorHost(KVConnectorBase_V1):
    """A vLLM connector (the mixins' super() calls reach vLLM's base class) that wraps another
    and keeps the tracing state of both roles."""

    _inner: KVConnectorBase_V1
    """The wrapped connector, which every hook delegates to."""
    _inner_supports_hma: bool
    """Whether the wrapped connector is SupportsHMA (request_finished_all_groups)."""
    _spans: HookSpans
    _sched: SchedulerTracing
    _work: WorkerTracing
    _trace_quiet_hooks: bool
    """kv_connector_extra_config's trace_quiet_hooks: quiet hooks get a span too."""
    _untraced: frozenset[str]
    """The no-op-by-default hooks the wrapped connector leaves to vLLM: run without a span."""
    _failure_policy: str
    """KVTransferConfig.kv_load_failure_policy, named on load_failed events."""
    _quiet_step: bool
    """Whether the bound step has no KV work: the per-step hooks then run bare."""


class LoadsAsync(Protocol):
    """A connector that answers vLLM 0.34's may_load_async (asked on each arrival)."""

    def may_load_async(self, request: Any) -> bool: ...


class KvCacheAccessClass(Protocol):
    """A connector class that answers vLLM 0.34's kv_cache_access (a classmethod), whose
    KVCacheAccess older releases do not define."""

    def kv_cache_access(self, kv_transfer_config: "KVTransferConfig") -> Any: ...
