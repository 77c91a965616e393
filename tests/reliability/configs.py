"""kv_transfer_configs of the matrix's engines: short timeouts, runtime fault plans."""

from pathlib import Path

from kvscope.harness.engine import free_port
from tests.reliability.record import PEER_LEASE_S

OFFLOAD_EXTRA = {"cpu_bytes_to_use": 8 << 20, "load_timeout_s": 1.5}
"""512 host blocks; a load not done in 1.5 s fails (the load_slow cells delay loads 5 s)."""
P2P_DECODE_EXTRA = {
    "lease_timeout_s": PEER_LEASE_S,
    "lease_margin_s": 0.5,
    "read_timeout_s": 3.0,
    "handshake_timeout_s": 3.0,
}
"""Decode-side timeouts: short, so a failing request fails well within checks.PROMPT_FAILURE_S."""


def offload_child(faults_path: Path) -> dict:
    return {
        "name": "offload",
        "kv_connector": "CpuOffloadConnector",
        "kv_connector_module_path": "kvscope.connector.cpu_offload.connector",
        "kv_connector_extra_config": {**OFFLOAD_EXTRA, "faults_path": str(faults_path)},
    }


def p2p_child() -> dict:
    return {
        "name": "p2p",
        "kv_connector": "P2PConnector",
        "kv_connector_module_path": "kvscope.connector.p2p.connector",
        "kv_connector_extra_config": {"side_channel_port": free_port(), **P2P_DECODE_EXTRA},
    }


def _alone(child: dict, policy: str) -> dict:
    """A child's config as an engine's only connector."""
    config = {key: value for key, value in child.items() if key != "name"}
    return {**config, "kv_role": "kv_both", "kv_load_failure_policy": policy}


def offload_config(policy: str, faults_path: Path) -> dict:
    return _alone(offload_child(faults_path), policy)


def p2p_config(policy: str) -> dict:
    return _alone(p2p_child(), policy)


def multi_config(policy: str, faults_path: Path) -> dict:
    """P2P first (it serves requests prefilled elsewhere), then the offload pool."""
    return {
        "kv_connector": "KvscopeMultiConnector",
        "kv_connector_module_path": "kvscope.connector.multi.connector",
        "kv_role": "kv_both",
        "kv_load_failure_policy": policy,
        "kv_connector_extra_config": {"connectors": [p2p_child(), offload_child(faults_path)]},
    }
