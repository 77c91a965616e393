"""kv_transfer_configs for the topology tests: every connector, short timeouts, fresh ports."""

import socket

from kvscope.harness.engine import free_port

OFFLOAD = "kvscope.connector.cpu_offload.connector"
P2P = "kvscope.connector.p2p.connector"
P2P_EXTRA = {
    "lease_timeout_s": 30.0,
    "lease_margin_s": 1.0,
    "read_timeout_s": 10.0,
    "handshake_timeout_s": 10.0,
}
"""Generous: four worker processes share two cores at TP=2, and a pull must not time out."""


def side_channel_port(tp_size: int) -> int:
    """A P2P side channel base port: rank r serves on base + r, so all tp_size must be free."""
    for _ in range(50):
        base = free_port()
        if all(_free(base + rank) for rank in range(1, tp_size)):
            return base
    raise RuntimeError(f"no {tp_size} consecutive free ports found")


def _free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _alone(config: dict, policy: str = "recompute") -> dict:
    return {**config, "kv_role": "kv_both", "kv_load_failure_policy": policy}


def offload_child() -> dict:
    return {
        "name": "offload",
        "kv_connector": "CpuOffloadConnector",
        "kv_connector_module_path": OFFLOAD,
        "kv_connector_extra_config": {"cpu_bytes_to_use": 8 << 20},
    }


def p2p_child(tp_size: int) -> dict:
    extra = {"side_channel_port": side_channel_port(tp_size), **P2P_EXTRA}
    return {
        "name": "p2p",
        "kv_connector": "P2PConnector",
        "kv_connector_module_path": P2P,
        "kv_connector_extra_config": extra,
    }


def offload_config() -> dict:
    return _alone({k: v for k, v in offload_child().items() if k != "name"})


def p2p_config(tp_size: int) -> dict:
    return _alone({k: v for k, v in p2p_child(tp_size).items() if k != "name"})


def multi_config(tp_size: int) -> dict:
    """The demo's composition: P2P first (requests prefilled elsewhere), then the offload pool."""
    children = [p2p_child(tp_size), offload_child()]
    return _alone(
        {
            "kv_connector": "KvscopeMultiConnector",
            "kv_connector_module_path": "kvscope.connector.multi.connector",
            "kv_connector_extra_config": {"connectors": children},
        }
    )


def traced_example_config(storage: str) -> dict:
    """vLLM's own ExampleConnector (disk), wrapped in kvscope's TracedConnector."""
    extra = {"connector": "ExampleConnector", "shared_storage_path": storage}
    return _alone(
        {
            "kv_connector": "TracedConnector",
            "kv_connector_module_path": "kvscope.connector.traced",
            "kv_connector_extra_config": extra,
        }
    )
