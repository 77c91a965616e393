"""The one builder of kvscope's kv_transfer_configs, in vLLM's format, for every engine we start.

A *child* is one connector as a MultiConnector names it (``name`` plus vLLM's connector keys); an
*engine config* is what ``kv_transfer_config`` takes: a child alone, or a Multi of children.
"""

from typing import Any

from kvscope.connector.plugin import names_of
from kvscope.harness.engine import free_port

OFFLOAD_CLASS = "CpuOffloadConnector"
OFFLOAD_MODULE = "kvscope.connector.cpu_offload.connector"
P2P_CLASS = "P2PConnector"
P2P_MODULE = "kvscope.connector.p2p.connector"
MULTI_CLASS = "KvscopeMultiConnector"
MULTI_MODULE = "kvscope.connector.multi.connector"
TRACED_CLASS = "TracedConnector"
TRACED_MODULE = "kvscope.connector.traced"

OFFLOAD_BYTES = 8 << 20
"""Host pool of the tests' offload connectors unless they say otherwise (512 tiny-model blocks)."""


def child(name: str, connector: str, module: str | None, /, **extra: Any) -> dict[str, Any]:
    """One connector as a Multi's child: its name, class, module and extra config."""
    config: dict[str, Any] = {"name": name, "kv_connector": connector}
    if module is not None:
        config["kv_connector_module_path"] = module
    config["kv_connector_extra_config"] = extra
    return config


def kvscope_connector(class_name: str, module: str, registered: bool) -> tuple[str, str | None]:
    """One of kvscope's connectors as kv_connector and kv_connector_module_path: by class and
    module, or (registered) by the name kvscope's vLLM plugin registers, with no module."""
    if not registered:
        return class_name, module
    (name,) = names_of(module, class_name)
    return name, None


def offload_child(name: str = "offload", *, registered: bool = False, **extra: Any) -> dict:
    """kvscope's CPU offload connector; extra goes to its kv_connector_extra_config."""
    extra = {"cpu_bytes_to_use": OFFLOAD_BYTES, **extra}
    return child(name, *kvscope_connector(OFFLOAD_CLASS, OFFLOAD_MODULE, registered), **extra)


def p2p_child(name: str = "p2p", *, registered: bool = False, **extra: Any) -> dict[str, Any]:
    """kvscope's P2P connector on a fresh side-channel port unless extra names one."""
    extra = {"side_channel_port": free_port(), **extra}
    return child(name, *kvscope_connector(P2P_CLASS, P2P_MODULE, registered), **extra)


def traced_child(
    connector: str, name: str = "traced", *, registered: bool = False, **extra: Any
) -> dict[str, Any]:
    """A connector by its registry name (vLLM's, or kvscope's registered ones) wrapped in
    kvscope's TracedConnector (itself by its registered name when registered)."""
    traced = kvscope_connector(TRACED_CLASS, TRACED_MODULE, registered)
    return child(name, *traced, connector=connector, **extra)


def engine_config(
    connector: dict[str, Any], policy: str = "recompute", role: str = "kv_both", **top: Any
) -> dict[str, Any]:
    """A child as an engine's only connector, with vLLM's role and load-failure policy."""
    config = {key: value for key, value in connector.items() if key != "name"}
    return {**config, "kv_role": role, "kv_load_failure_policy": policy, **top}


def multi_config(
    *children: dict[str, Any],
    policy: str = "recompute",
    role: str = "kv_both",
    registered: bool = False,
    **extra: Any,
) -> dict[str, Any]:
    """kvscope's MultiConnector over children, tried in the order given."""
    multi_class = kvscope_connector(MULTI_CLASS, MULTI_MODULE, registered)
    multi = child("multi", *multi_class, connectors=list(children), **extra)
    return engine_config(multi, policy, role)


def offload_config(
    policy: str = "recompute", *, registered: bool = False, **extra: Any
) -> dict[str, Any]:
    """The offload connector alone."""
    return engine_config(offload_child(registered=registered, **extra), policy)


def p2p_config(policy: str = "recompute", *, registered: bool = False, **extra: Any) -> dict:
    """The P2P connector alone."""
    return engine_config(p2p_child(registered=registered, **extra), policy)


def demo_children(
    side_channel_port: int, faults_path: Any, **offload_extra: Any
) -> list[dict[str, Any]]:
    """The demo's connectors: P2P first (it serves a request prefilled elsewhere), then offload;
    offload_extra adds to (or replaces) the offload child's keys."""
    return [
        p2p_child(side_channel_port=side_channel_port, lease_timeout_s=20.0),
        offload_child(
            cpu_bytes_to_use=64 << 20,
            faults_path=str(faults_path),
            # Shorter than the slow-load fault, so those loads time out and recompute.
            load_timeout_s=0.5,
            **offload_extra,
        ),
    ]


def demo_config(side_channel_port: int, faults_path: Any, policy: str = "recompute") -> dict:
    """The demo's engines: a Multi over demo_children."""
    return multi_config(*demo_children(side_channel_port, faults_path), policy=policy)
