"""Builds a MultiConnector's children from kv_connector_extra_config["connectors"]."""

import copy
from dataclasses import dataclass
from typing import Any

from vllm.config.kv_transfer import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1

from kvscope.connector.child_config import child_transfer_config
from kvscope.traces.instrumented import InstrumentedConnector

CHILD_KEYS = {"kv_connector", "kv_connector_module_path", "kv_connector_extra_config", "name"}


@dataclass
class Child:
    """One child connector and the name its spans and timelines carry."""

    name: str
    connector: KVConnectorBase_V1


def child_configs(extra_config: dict[str, Any]) -> list[dict[str, Any]]:
    """The children's configs, checked, each with a unique name."""
    configs = extra_config.get("connectors")
    if not configs or not isinstance(configs, list):
        raise ValueError(
            "MultiConnector needs kv_connector_extra_config['connectors']: a list of {"
            "'kv_connector': ..., 'kv_connector_module_path': ..., "
            "'kv_connector_extra_config': ...}"
        )
    names: list[str] = []
    for index, config in enumerate(configs):
        unknown = set(config) - CHILD_KEYS
        if unknown or "kv_connector" not in config:
            raise ValueError(f"child {index}: needs kv_connector; unknown keys {sorted(unknown)}")
        name = config.get("name") or config["kv_connector"]
        names.append(name if name not in names else f"{name}#{index}")
    return [{**config, "name": name} for config, name in zip(configs, names, strict=True)]


def child_class(config: dict[str, Any], outer: KVTransferConfig | None = None) -> type:
    """The class to build; kvscope's traced connectors give their untraced core, because the
    MultiConnector traces its children itself (as children of its own hook spans)."""
    cls = KVConnectorFactory.get_connector_class(transfer_config(config, outer))
    if issubclass(cls, InstrumentedConnector):
        cls = cls.inner_class(config.get("kv_connector_extra_config") or {})
    return cls


def transfer_config(config: dict[str, Any], outer: KVTransferConfig | None) -> KVTransferConfig:
    return child_transfer_config(
        config["kv_connector"],
        config.get("kv_connector_module_path"),
        config.get("kv_connector_extra_config") or {},
        outer,
    )


def build_children(vllm_config: Any, role: Any, kv_cache_config: Any) -> list[Child]:
    outer = vllm_config.kv_transfer_config
    children = []
    for config in child_configs(outer.kv_connector_extra_config or {}):
        child_config = copy.copy(vllm_config)
        child_config.kv_transfer_config = transfer_config(config, outer)
        connector = child_class(config, outer)(child_config, role, kv_cache_config)
        # The Multi reports what a child's failed load became: a fallback, or the policy.
        if hasattr(connector, "leave_failure_outcome_to_parent"):
            connector.leave_failure_outcome_to_parent()
        children.append(Child(config["name"], connector))
    return children
