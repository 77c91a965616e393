"""TracedConnector: load any KV connector (vLLM built-in or a module path) with every hook traced.

kv_transfer_config = {  # or "kv_connector": "KvscopeTracedConnector" alone (connector/plugin.py)
    "kv_connector": "TracedConnector",
    "kv_connector_module_path": "kvscope.connector.traced",
    "kv_role": "kv_both",
    "kv_connector_extra_config": {
        "connector": "ExampleConnector",          # the connector to wrap
        "connector_module_path": None,            # its module, when not a registered name
        "shared_storage_path": "/tmp/kv",         # anything else goes to the wrapped one
    },
}
"""

from typing import TYPE_CHECKING, Any, Final

from vllm.config.kv_transfer import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorRole,
    SupportsHMA,
)

from kvscope.connector.child_config import child_transfer_config
from kvscope.connector.common.kv_cache_access import configured_access
from kvscope.connector.plugin import names_of
from kvscope.connector.traced_stats import (
    TracedPromMetrics,
    rebuild_stats,
    traced_stats,
)
from kvscope.traces.instrumented import InstrumentedConnector

if TYPE_CHECKING:
    from vllm.config import VllmConfig

EXTRA_CONNECTOR: Final = "connector"
"""kv_connector_extra_config key naming the connector to wrap."""

EXTRA_MODULE_PATH: Final = "connector_module_path"
"""kv_connector_extra_config key with the wrapped connector's module, for non-built-ins."""


class TracedBase(InstrumentedConnector):
    """Wraps the connector named in kv_connector_extra_config and traces its hooks (without
    saying SupportsHMA: TracedConnector does, traced_as's classes when their connector does)."""

    @classmethod
    def inner_class(cls, extra_config: dict[str, Any]) -> type[KVConnectorBase_V1]:
        return KVConnectorFactory.get_connector_class(cls._inner_transfer_config(extra_config))

    @classmethod
    def inner_extra_config(cls, extra_config: dict[str, Any]) -> dict[str, Any]:
        own = (EXTRA_CONNECTOR, EXTRA_MODULE_PATH)
        return {k: v for k, v in super().inner_extra_config(extra_config).items() if k not in own}

    @classmethod
    def _inner_transfer_config(cls, extra_config: dict[str, Any], outer=None) -> KVTransferConfig:
        name = extra_config.get(EXTRA_CONNECTOR)
        if not name:
            raise ValueError(
                "TracedConnector needs the connector to wrap: set "
                f"kv_connector_extra_config['{EXTRA_CONNECTOR}'] (e.g. 'ExampleConnector')"
            )
        if name == cls.__name__ or name in names_of(cls.__module__, cls.__name__):
            raise ValueError(f"TracedConnector cannot wrap itself (asked to wrap {name!r})")
        return child_transfer_config(
            name, extra_config.get(EXTRA_MODULE_PATH), cls.inner_extra_config(extra_config), outer
        )

    @classmethod
    def inner_transfer_config(cls, kv_transfer_config: KVTransferConfig) -> KVTransferConfig:
        extra = kv_transfer_config.kv_connector_extra_config or {}
        return cls._inner_transfer_config(extra, kv_transfer_config)

    @classmethod
    def kv_cache_access(cls, kv_transfer_config: KVTransferConfig) -> Any:
        """The wrapped connector's answer as vLLM's factory gives it for that connector's own
        config (the factory also knows a stock LMCacheMPConnector's legacy CUDA IPC)."""
        return configured_access(cls.inner_transfer_config(kv_transfer_config))

    # --- the wrapped connector as code that holds the wrapper sees it ------------------------
    # A transparent proxy, as wrapt's ObjectProxy is to OpenTelemetry's instrumentations: what
    # checks the connector's class (isinstance(scheduler.connector, OffloadingConnector), vLLM's
    # own _find_simple_cpu_offload_connector) and what reads a public attribute the connector's
    # API does not name (a connector's own state, its connector_scheduler) gets the wrapped
    # connector's. type(), private names, the API's members and every hook stay the wrapper's.

    @property  # type: ignore[misc]  # isinstance() reads __class__ where type() does not match
    def __class__(self) -> type:
        inner = self.__dict__.get("_inner")
        return type(self) if inner is None else type(inner)

    def __getattr__(self, name: str) -> Any:
        """A public attribute neither the wrapper nor vLLM's base class has: the wrapped
        connector's. Private names stay each object's own (the wrapper's state is never the
        wrapped connector's, whatever the two call it), and so do dunders (copy, pickle)."""
        inner = self.__dict__.get("_inner")
        if inner is None or name.startswith("_"):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return getattr(inner, name)

    def __setattr__(self, name: str, value: Any) -> None:
        """Setting a public attribute the wrapped connector has and the wrapper does not (a
        test's or a tool's reach into the connector's state) sets the wrapped connector's."""
        # Private names first and without a lookup: the hooks set the wrapper's own state (the
        # quiet-step flag) every step.
        if name.startswith("_") or name in self.__dict__:
            object.__setattr__(self, name, value)
            return
        inner = self.__dict__.get("_inner")
        if inner is not None and not hasattr(type(self), name) and hasattr(inner, name):
            setattr(inner, name, value)
        else:
            object.__setattr__(self, name, value)

    @property
    def _connectors(self) -> list[KVConnectorBase_V1]:
        """The wrapped connector's children, if it has any (vLLM's MultiConnector): what
        vLLM's _find_simple_cpu_offload_connector walks; the wrapper itself answers its
        isinstance for the connector it wraps."""
        return getattr(self._inner, "_connectors", None) or []

    def build_inner(self, vllm_config: "VllmConfig", role: KVConnectorRole, kv_cache_config):
        inner_config = self.inner_vllm_config(vllm_config)
        inner_class = KVConnectorFactory.get_connector_class(inner_config.kv_transfer_config)
        return inner_class(inner_config, role, kv_cache_config)

    # --- stats: the logger process knows only this class, not the one it wraps ---------------

    stats_named: bool = True
    """Whether the stats carry the wrapped class's name (TracedStats): where this class alone
    cannot say which class rebuilds them. A class made for one connector (traced_as) knows it
    and hands on the connector's own stats, so that SchedulerStats holds the bare payload."""

    def get_kv_connector_stats(self) -> Any:
        stats = super().get_kv_connector_stats()
        if stats is None or not self.stats_named:
            return stats
        return traced_stats(stats, type(self._inner))

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None):
        """The wrapped class's own stats object, rebuilt by that class from its payload (named
        in TracedStats.to_dict() where it must be): vLLM's logger then aggregates, reduces and
        logs exactly what it would bare."""
        if not cls.stats_named:
            return super().build_kv_connector_stats(data)
        return rebuild_stats(data)

    @classmethod
    def build_prom_metrics(cls, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        inner = super().build_prom_metrics(
            vllm_config, metric_types, labelnames, per_engine_labelvalues
        )
        if inner is None or not cls.stats_named:
            return inner
        labels = (labelnames, per_engine_labelvalues)
        return TracedPromMetrics(vllm_config, metric_types, *labels, inner)


class TracedConnector(TracedBase, SupportsHMA):
    """Wraps the connector named in kv_connector_extra_config and traces its hooks.

    SupportsHMA, because vLLM asks the class before reading any config: a wrapped connector
    that is SupportsHMA gets every KV cache group; one that is not works with models of one
    group, and with several groups refuses to start, naming --disable-hybrid-kv-cache-manager
    (connector/traced_as.py traces a connector under its own name, so that vLLM turns the
    hybrid KV cache manager off for it as it would bare).
    """


TracedHMAConnector = TracedConnector
"""The name configs used before TracedConnector covered both cases."""
