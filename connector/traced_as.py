"""Any KV connector traced under its own name: vLLM asks the class it finds what it would ask the
connector's own.

kv_transfer_config = {
    "kv_connector": "NixlConnector",              # the connector to trace, by its own name
    "kv_connector_module_path": "kvscope.connector.traced_as",
    "kv_role": "kv_both",
    "kv_connector_extra_config": {...},           # the connector's own config (and trace_* keys)
}

A class of your own module is named with its module: "kv_connector": "my.module.MyConnector".
vLLM finds the class as getattr(this module, kv_connector) and asks it questions before any
connector exists: whether it is SupportsHMA (if not, vLLM turns the hybrid KV cache manager
off), and, by the name "MultiConnector", whether each child is. The class found here is a
TracedConnector made for that one connector, SupportsHMA exactly when it is, and the name vLLM
reads is the connector's own.
"""

import functools
from typing import Any

from vllm.config.kv_transfer import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.v1.base import SupportsHMA, supports_hma

from kvscope.connector.child_config import child_transfer_config
from kvscope.connector.traced import TracedBase

_DOT = "__"
"""What stands for '.' in a class's attribute name here (pickle finds classes by attribute)."""


class TracedAs(TracedBase):
    """TracedConnector over one connector fixed by its class (see traced_class)."""

    wrapped_name: str = ""  # the connector's name as kv_connector gives it
    stats_named = False  # the class rebuilds its connector's stats: they pass as they are

    @classmethod
    def _inner_transfer_config(cls, extra_config: dict[str, Any], outer=None) -> KVTransferConfig:
        module_path, class_name = _split(cls.wrapped_name)
        return child_transfer_config(
            class_name, module_path, cls.inner_extra_config(extra_config), outer
        )


def __getattr__(name: str) -> type[TracedAs]:
    """vLLM's getattr(module, kv_connector): the traced class of that connector."""
    if name.startswith("_"):
        raise AttributeError(name)
    return traced_class(name.replace(_DOT, "."))


@functools.cache
def traced_class(name: str) -> type[TracedAs]:
    """The traced class of the connector `name` (a registered name, or module.Class), made once
    per process; SupportsHMA when that connector is. Raises vLLM's error for an unknown one."""
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    module_path, class_name = _split(name)
    if module_path == __name__:
        raise ValueError(f"{__name__} cannot trace its own classes (asked for {name!r})")
    inner = KVConnectorFactory.get_connector_class(
        child_transfer_config(class_name, module_path, {})
    )
    if issubclass(inner, TracedBase):
        raise ValueError(f"{name} is traced already: name the connector it wraps")
    bases = (TracedAs, SupportsHMA) if supports_hma(inner) else (TracedAs,)
    attribute = name.replace(".", _DOT)
    return type(
        f"Traced{class_name}",
        bases,
        {"__module__": __name__, "__qualname__": attribute, "wrapped_name": name},
    )


def _split(name: str) -> tuple[str | None, str]:
    module_path, _, class_name = name.rpartition(".")
    return module_path or None, class_name
