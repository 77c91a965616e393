"""Registers kvscope's connectors by name with vLLM (the vllm.general_plugins entry point)."""

import logging
from typing import Final

logger = logging.getLogger(__name__)

CONNECTORS: Final[dict[str, tuple[str, str]]] = {
    "KvscopeCpuOffloadConnector": (
        "kvscope.connector.cpu_offload.connector",
        "CpuOffloadConnector",
    ),
    "KvscopeP2PConnector": ("kvscope.connector.p2p.connector", "P2PConnector"),
    "KvscopeMultiConnector": ("kvscope.connector.multi.connector", "KvscopeMultiConnector"),
    "KvscopeTracedConnector": ("kvscope.connector.traced", "TracedConnector"),
}
"""Registered name -> (module path, class name): with kvscope installed, a kv_transfer_config
names one of these in "kv_connector" and needs no "kv_connector_module_path". vLLM imports the
module only when an engine asks for that name."""


def names_of(module_path: str, class_name: str) -> tuple[str, ...]:
    """The registered names that load this class (none for a class kvscope does not register)."""
    return tuple(name for name, target in CONNECTORS.items() if target == (module_path, class_name))


def register() -> None:
    """Registers every name of CONNECTORS that vLLM's factory does not know yet, lazily (vLLM
    keeps the module path and class name and imports on first use).

    vLLM calls this in every process it loads general plugins in (the API server or LLM
    process, the engine core, each worker), possibly more than once: a name already there is
    left as it is, and a failure is logged, never raised into vLLM.
    """
    try:
        from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    except Exception:
        logger.warning("kvscope: vLLM's KV connector factory did not import", exc_info=True)
        return
    for name, (module_path, class_name) in CONNECTORS.items():
        if name in getattr(KVConnectorFactory, "_registry", {}):
            logger.debug("kvscope: KV connector %s is registered already", name)
            continue
        try:
            KVConnectorFactory.register_connector(name, module_path, class_name)
        except ValueError:
            # Registered between the check and now, or a vLLM without _registry: already there.
            logger.debug("kvscope: KV connector %s is registered already", name, exc_info=True)
        except Exception:
            logger.warning("kvscope: KV connector %s was not registered", name, exc_info=True)
