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
    TracedStats,
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

    def build_inner(self, vllm_config: "VllmConfig", role: KVConnectorRole, kv_cache_config):
        inner_config = self.inner_vllm_config(vllm_config)
        inner_class = KVConnectorFactory.get_connector_class(inner_config.kv_transfer_config)
        return inner_class(inner_config, role, kv_cache_config)

    # --- stats: the logger process knows only this class, not the one it wraps ---------------

    def get_kv_connector_stats(self) -> TracedStats | None:
        stats = super().get_kv_connector_stats()
        return None if stats is None else traced_stats(stats, type(self._inner))

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None):
        """The wrapped class's own stats object, rebuilt from TracedStats.to_dict() by that
        class: vLLM's logger then aggregates, reduces and logs exactly what it would bare."""
        return rebuild_stats(data)

    @classmethod
    def build_prom_metrics(cls, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        inner = super().build_prom_metrics(
            vllm_config, metric_types, labelnames, per_engine_labelvalues
        )
        if inner is None:
            return None
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
