"""Builds a MultiConnector's children from kv_connector_extra_config["connectors"]."""

import copy
from dataclasses import dataclass
from typing import Any

from vllm.config.kv_transfer import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, supports_hma

from kvscope.connector.child_config import TRANSFER_FIELDS, child_transfer_config
from kvscope.traces.instrumented import InstrumentedConnector

OWN_KEYS = frozenset({"name"})
"""Child keys of kvscope's own; every other key is a KVTransferConfig field, as in vLLM's
MultiConnector."""

CHILD_KEYS = TRANSFER_FIELDS | OWN_KEYS
_PASSED_APART = ("kv_connector", "kv_connector_module_path", "kv_connector_extra_config")


@dataclass
class Child:
    """One child connector, the name its spans, timelines and stats carry, and the class built
    (the logger process rebuilds the child's stats with it: for a traced child the class it
    wraps, which a config naming TracedConnector alone would not tell)."""

    name: str
    connector: KVConnectorBase_V1
    kv_connector: str = ""
    module_path: str | None = None


def child_configs(extra_config: dict[str, Any], outer_role: str | None = None) -> list[dict]:
    """The children's configs, checked, each with a unique name; a child's kv_role must be the
    Multi's (outer_role), when that is known."""
    configs = extra_config.get("connectors")
    if not configs or not isinstance(configs, list):
        raise ValueError(
            "MultiConnector needs kv_connector_extra_config['connectors']: a list of {"
            "'kv_connector': ..., 'kv_connector_module_path': ..., "
            "'kv_connector_extra_config': ...}"
        )
    names: list[str] = []
    for index, config in enumerate(configs):
        check_child(index, config, outer_role)
        name = config.get("name") or config["kv_connector"]
        names.append(name if name not in names else f"{name}#{index}")
    return [{**config, "name": name} for config, name in zip(configs, names, strict=True)]


def check_child(index: int, config: Any, outer_role: str | None) -> None:
    """Refuses, with what to change, a child vLLM's MultiConnector would refuse or that could
    not run beside the Multi."""
    if not isinstance(config, dict):
        raise ValueError(f"child {index}: a child is a dict with 'kv_connector', got {config!r}")
    label = f"child {index} ({config.get('name') or config.get('kv_connector')})"
    unknown = set(config) - CHILD_KEYS
    if unknown:
        raise ValueError(
            f"{label}: unknown keys {sorted(unknown)}; a child takes 'name' and the fields of "
            f"vLLM's KVTransferConfig: {sorted(TRANSFER_FIELDS)}"
        )
    if not isinstance(config.get("kv_connector"), str) or not config["kv_connector"]:
        raise ValueError(f"{label}: needs kv_connector, the connector's class name")
    role = config.get("kv_role")
    # Children run in the Multi's engine, on its side of a P/D pair: another role would make
    # a child produce or consume KV the engine does not. kv_both fits either side (vLLM's own
    # configs give a MultiConnector's children kv_both under a consumer or producer Multi).
    if role is not None and outer_role is not None and role not in (outer_role, "kv_both"):
        raise ValueError(
            f"{label}: kv_role {role!r} differs from the KvscopeMultiConnector's kv_role "
            f"{outer_role!r}; set the child's kv_role to {outer_role!r} or leave it out "
            f"(a child inherits the Multi's)"
        )


def configured_class(config: dict[str, Any], outer: KVTransferConfig | None = None) -> type:
    """The class the child's config names."""
    return KVConnectorFactory.get_connector_class(transfer_config(config, outer))


def child_class(config: dict[str, Any], outer: KVTransferConfig | None = None) -> type:
    """The class to build; kvscope's traced connectors give their untraced core, because the
    MultiConnector traces its children itself (as children of its own hook spans)."""
    cls = configured_class(config, outer)
    if issubclass(cls, InstrumentedConnector):
        cls = cls.inner_class(config.get("kv_connector_extra_config") or {})
    return cls


def child_supports_hma(config: dict[str, Any], outer: KVTransferConfig | None = None) -> bool:
    """Whether vLLM may give the child every KV cache group: its class is SupportsHMA (kvscope's
    traced children asked as their untraced core), and a vLLM MultiConnector child only when
    all of its own children are (vLLM's factory asks it so)."""
    if not supports_hma(child_class(config, outer)):
        return False
    if config["kv_connector"] != "MultiConnector":
        return True
    return KVConnectorFactory.supports_hma_config(transfer_config(config, outer))


def transfer_config(config: dict[str, Any], outer: KVTransferConfig | None) -> KVTransferConfig:
    """The child's own KVTransferConfig: its fields over what it inherits from the Multi."""
    # A field given as None is left out, so the child inherits it (vLLM would refuse a None role).
    fields = {
        k: v
        for k, v in config.items()
        if k in TRANSFER_FIELDS and k not in _PASSED_APART and v is not None
    }
    try:
        return child_transfer_config(
            config["kv_connector"],
            config.get("kv_connector_module_path"),
            config.get("kv_connector_extra_config") or {},
            outer,
            **fields,
        )
    except ValueError as error:  # pydantic's ValidationError too
        label = config.get("name") or config["kv_connector"]
        raise ValueError(f"child {label}: {error}") from error


def child_vllm_config(config: dict[str, Any], vllm_config: Any) -> Any:
    """The engine's config with the child's KVTransferConfig in place of the Multi's."""
    child_config = copy.copy(vllm_config)
    child_config.kv_transfer_config = transfer_config(config, vllm_config.kv_transfer_config)
    return child_config


def build_children(vllm_config: Any, role: Any, kv_cache_config: Any) -> list[Child]:
    outer = vllm_config.kv_transfer_config
    children = []
    for config in child_configs(outer.kv_connector_extra_config or {}, outer.kv_role):
        child_config = child_vllm_config(config, vllm_config)
        connector = child_class(config, outer)(child_config, role, kv_cache_config)
        # The Multi reports what a child's failed load became: a fallback, or the policy.
        if hasattr(connector, "leave_failure_outcome_to_parent"):
            connector.leave_failure_outcome_to_parent()
        built = type(connector)
        children.append(Child(config["name"], connector, built.__name__, built.__module__))
    return children
