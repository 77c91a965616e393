"""Names the connector to verify and builds the kv_transfer_config that wraps it in tracing."""

import importlib
import tempfile
from dataclasses import dataclass, field
from typing import Any

from kvscope.connector.plugin import CONNECTORS, names_of
from kvscope.harness import configs

KVSCOPE_CONNECTORS: dict[str, str] = {
    configs.OFFLOAD_CLASS: configs.OFFLOAD_MODULE,
    configs.P2P_CLASS: configs.P2P_MODULE,
    configs.MULTI_CLASS: configs.MULTI_MODULE,
}
"""kvscope's own connectors, accepted by class name alone (and by their registered names,
connector/plugin.py's CONNECTORS)."""

FAULTS_PATH_KEY = "faults_path"
"""Extra-config key of kvscope's fault plan file (connector/cpu_offload/faults.py)."""


@dataclass
class ConnectorSpec:
    """The connector under test: class name, module (None for a vLLM built-in), its config."""

    name: str
    module_path: str | None
    extra_config: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{self.module_path}:{self.name}" if self.module_path else self.name


def parse_connector(text: str, extra_config: dict[str, Any] | None = None) -> ConnectorSpec:
    """'ExampleConnector' (vLLM's registry or kvscope's), or 'package.module:ClassName'."""
    text = text.strip()
    module, _, name = text.rpartition(":")
    if not name.isidentifier() or (":" in text and not module):
        raise ValueError(f"--connector {text!r}: give a class name or module.path:ClassName")
    if not module and name in CONNECTORS:  # a registered name: the class it loads
        module, name = CONNECTORS[name]
    module_path = module or KVSCOPE_CONNECTORS.get(name)
    if module_path is None:
        from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

        known = sorted(KVConnectorFactory._registry)
        if name not in known:
            raise ValueError(
                f"--connector {name!r} is not a vLLM built-in ({', '.join(known)}) nor one of "
                f"kvscope's ({', '.join(KVSCOPE_CONNECTORS)}): give module.path:{name}"
            )
    return ConnectorSpec(name, module_path or None, dict(extra_config or {}))


def with_defaults(spec: ConnectorSpec) -> ConnectorSpec:
    """vLLM's ExampleConnector (or a subclass) stores in a folder, /tmp unless told: a fresh
    one, so nothing from an earlier run can be served."""
    extra = dict(spec.extra_config)
    if _is_example_connector(spec) and "shared_storage_path" not in extra:
        extra["shared_storage_path"] = tempfile.mkdtemp(prefix="kvscope-verify-example-")
    return ConnectorSpec(spec.name, spec.module_path, extra)


def _is_example_connector(spec: ConnectorSpec) -> bool:
    from vllm.distributed.kv_transfer.kv_connector.v1.example_connector import ExampleConnector

    if spec.module_path is None:
        return spec.name == "ExampleConnector"
    connector_class = getattr(importlib.import_module(spec.module_path), spec.name, None)
    return isinstance(connector_class, type) and issubclass(connector_class, ExampleConnector)


def traced_transfer_config(spec: ConnectorSpec, policy: str) -> dict[str, Any]:
    """The connector wrapped in kvscope's TracedConnector, under that load failure policy."""
    traced = configs.traced_child(spec.name)
    # Updated, not passed as keywords: the user's config may hold any key, even "name".
    traced["kv_connector_extra_config"].update(spec.extra_config)
    if spec.module_path:
        traced["kv_connector_extra_config"]["connector_module_path"] = spec.module_path
    return configs.engine_config(traced, policy)


def fault_plan_paths(spec: ConnectorSpec) -> list[str]:
    """The fault plan files this config names (the connector's own failure path): its own and,
    for a Multi, its children's. Empty when the connector has no failure path kvscope knows."""
    paths = [spec.extra_config.get(FAULTS_PATH_KEY)]
    for child in spec.extra_config.get("connectors", []) or []:
        paths.append((child.get("kv_connector_extra_config") or {}).get(FAULTS_PATH_KEY))
    return [path for path in paths if path]


def add_fault_paths(spec: ConnectorSpec, folder: str) -> ConnectorSpec:
    """kvscope's offload connector (alone or as a Multi's child) without a fault plan file
    gets one in folder, so the failed-load scenarios can go through its own failure path."""
    extra = dict(spec.extra_config)
    if _is_offload(spec.name, spec.module_path) and FAULTS_PATH_KEY not in extra:
        extra[FAULTS_PATH_KEY] = f"{folder}/faults.json"
    children = []
    for i, child in enumerate(extra.get("connectors", []) or []):
        child = dict(child)
        child_extra = dict(child.get("kv_connector_extra_config") or {})
        offload = _is_offload(child.get("kv_connector"), child.get("kv_connector_module_path"))
        if offload and FAULTS_PATH_KEY not in child_extra:
            child_extra[FAULTS_PATH_KEY] = f"{folder}/faults-{i}.json"
        child["kv_connector_extra_config"] = child_extra
        children.append(child)
    if children:
        extra["connectors"] = children
    return ConnectorSpec(spec.name, spec.module_path, extra)


def _is_offload(name: str | None, module_path: str | None) -> bool:
    """Whether a connector's config names kvscope's offload connector: by its module, or by
    its registered name with no module."""
    if module_path is not None:
        return module_path == configs.OFFLOAD_MODULE
    return name in names_of(configs.OFFLOAD_MODULE, configs.OFFLOAD_CLASS)
