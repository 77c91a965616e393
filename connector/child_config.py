"""The KVTransferConfig of a connector built inside another (TracedConnector, the Multi)."""

import dataclasses
from typing import Any

from vllm.config.kv_transfer import KVTransferConfig

from kvscope.connector import plugin

TRANSFER_FIELDS: frozenset[str] = frozenset(f.name for f in dataclasses.fields(KVTransferConfig))
"""Every key of vLLM's KVTransferConfig: what vLLM's MultiConnector accepts in a child."""

INHERITED = ("engine_id", "kv_role", "kv_buffer_device", "kv_load_failure_policy")
"""What a child shares with the connector it is built in, unless it sets its own."""


def child_transfer_config(
    kv_connector: str,
    module_path: str | None,
    extra_config: dict[str, Any],
    outer: KVTransferConfig | None = None,
    **fields: Any,
) -> KVTransferConfig:
    """A child shares the outer engine id, role, buffer device and failure policy, and takes
    any other KVTransferConfig field it sets (fields); without an outer config (vLLM asking
    only for the class) a placeholder role is enough.

    A child named by one of kvscope's registered names (plugin.CONNECTORS) resolves even in a
    process vLLM loaded no plugins in (VLLM_PLUGINS leaving kvscope out, or no engine at all):
    the names are registered here first, as the plugin would have."""
    if module_path is None and kv_connector in plugin.CONNECTORS:
        plugin.register()
    shared: dict[str, Any] = {"kv_role": "kv_both"}
    if outer is not None:
        shared = {name: getattr(outer, name) for name in INHERITED}
    return KVTransferConfig(
        **{**shared, **fields},
        kv_connector=kv_connector,
        kv_connector_module_path=module_path,
        kv_connector_extra_config=extra_config,
    )
