"""kv_transfer_configs for the topology tests: harness/configs.py's, with generous P2P timeouts
and side-channel ports free on every rank."""

import socket

from kvscope.harness import configs
from kvscope.harness.engine import free_port

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


def p2p_child(tp_size: int) -> dict:
    return configs.p2p_child(side_channel_port=side_channel_port(tp_size), **P2P_EXTRA)


def offload_config() -> dict:
    return configs.offload_config()


def p2p_config(tp_size: int) -> dict:
    return configs.engine_config(p2p_child(tp_size))


def multi_config(tp_size: int) -> dict:
    """The demo's composition: P2P first (requests prefilled elsewhere), then the offload pool."""
    return configs.multi_config(p2p_child(tp_size), configs.offload_child())


def traced_example_config(storage: str) -> dict:
    """vLLM's own ExampleConnector (disk), wrapped in kvscope's TracedConnector."""
    return configs.engine_config(
        configs.traced_child("ExampleConnector", shared_storage_path=storage)
    )
