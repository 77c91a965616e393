"""The KVTransferConfig of a connector built inside another (TracedConnector, the Multi)."""

from typing import Any

from vllm.config.kv_transfer import KVTransferConfig


def child_transfer_config(
    kv_connector: str,
    module_path: str | None,
    extra_config: dict[str, Any],
    outer: KVTransferConfig | None = None,
) -> KVTransferConfig:
    """A child shares the outer engine id, role, buffer device and failure policy; without
    an outer config (vLLM asking only for the class) a placeholder role is enough."""
    shared: dict[str, Any] = {"kv_role": "kv_both"}
    if outer is not None:
        shared = {
            "engine_id": outer.engine_id,
            "kv_role": outer.kv_role,
            "kv_buffer_device": outer.kv_buffer_device,
            "kv_load_failure_policy": outer.kv_load_failure_policy,
        }
    return KVTransferConfig(
        kv_connector=kv_connector,
        kv_connector_module_path=module_path,
        kv_connector_extra_config=extra_config,
        **shared,
    )
