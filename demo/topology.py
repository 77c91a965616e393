"""The demo's KV transfer configs: prefill and decode each run P2P + CPU offload in a Multi."""

from pathlib import Path


def offload_child(faults_path: Path, load_timeout_s: float) -> dict:
    return {
        "name": "offload",
        "kv_connector": "CpuOffloadConnector",
        "kv_connector_module_path": "kvscope.connector.cpu_offload.connector",
        "kv_connector_extra_config": {
            "cpu_bytes_to_use": 64 << 20,
            "faults_path": str(faults_path),
            "load_timeout_s": load_timeout_s,
        },
    }


def p2p_child(side_channel_port: int, lease_timeout_s: float) -> dict:
    return {
        "name": "p2p",
        "kv_connector": "P2PConnector",
        "kv_connector_module_path": "kvscope.connector.p2p.connector",
        "kv_connector_extra_config": {
            "side_channel_port": side_channel_port,
            "lease_timeout_s": lease_timeout_s,
        },
    }


def engine_config(side_channel_port: int, faults_path: Path, policy: str = "recompute") -> dict:
    """P2P first (it serves a request whose prefill ran elsewhere), then the offload pool."""
    return {
        "kv_connector": "KvscopeMultiConnector",
        "kv_connector_module_path": "kvscope.connector.multi.connector",
        "kv_role": "kv_both",
        "kv_load_failure_policy": policy,
        "kv_connector_extra_config": {
            "connectors": [
                p2p_child(side_channel_port, lease_timeout_s=20.0),
                # Shorter than the slow-load fault, so those loads time out and recompute.
                offload_child(faults_path, load_timeout_s=0.5),
            ],
        },
    }
