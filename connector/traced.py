"""TracedConnector: load any KV connector (vLLM built-in or a module path) with every hook traced.

kv_transfer_config = {
    "kv_connector": "TracedConnector",
    "kv_connector_module_path": "kvscope.connector.traced",
    "kv_role": "kv_both",
    "kv_connector_extra_config": {
        "connector": "ExampleConnector",          # the connector to wrap
        "connector_module_path": None,            # its module, when not a vLLM built-in
        "shared_storage_path": "/tmp/kv",         # anything else goes to the wrapped one
    },
}
"""

import copy
from typing import Any

from vllm.config.kv_transfer import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorRole,
    SupportsHMA,
)

from kvscope.connector.child_config import child_transfer_config
from kvscope.traces.instrumented import InstrumentedConnector

EXTRA_CONNECTOR = "connector"
"""kv_connector_extra_config key naming the connector to wrap."""

EXTRA_MODULE_PATH = "connector_module_path"
"""kv_connector_extra_config key with the wrapped connector's module, for non-built-ins."""


class TracedConnector(InstrumentedConnector, SupportsHMA):
    """Wraps the connector named in kv_connector_extra_config and traces its hooks.

    SupportsHMA, because vLLM asks the class before reading any config: a wrapped connector
    that is SupportsHMA gets every KV cache group; one that is not works with models of one
    group, and with several groups refuses to start, naming --disable-hybrid-kv-cache-manager.
    """

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
        if name == cls.__name__:
            raise ValueError("TracedConnector cannot wrap itself")
        return child_transfer_config(
            name, extra_config.get(EXTRA_MODULE_PATH), cls.inner_extra_config(extra_config), outer
        )

    @classmethod
    def inner_vllm_config(cls, vllm_config: Any) -> Any:
        outer = vllm_config.kv_transfer_config
        inner = copy.copy(vllm_config)
        inner.kv_transfer_config = cls._inner_transfer_config(
            outer.kv_connector_extra_config or {}, outer
        )
        return inner

    def build_inner(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any):
        inner_config = self.inner_vllm_config(vllm_config)
        inner_class = KVConnectorFactory.get_connector_class(inner_config.kv_transfer_config)
        return inner_class(inner_config, role, kv_cache_config)


TracedHMAConnector = TracedConnector
"""The name configs used before TracedConnector covered both cases."""
