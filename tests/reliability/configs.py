"""kv_transfer_configs of the matrix's engines: harness/configs.py's, with short timeouts and
runtime fault plans."""

from pathlib import Path

from kvscope.harness import configs
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
    return configs.offload_child(**OFFLOAD_EXTRA, faults_path=str(faults_path))


def p2p_child() -> dict:
    return configs.p2p_child(**P2P_DECODE_EXTRA)


def offload_config(policy: str, faults_path: Path) -> dict:
    return configs.engine_config(offload_child(faults_path), policy)


def p2p_config(policy: str) -> dict:
    return configs.engine_config(p2p_child(), policy)


def multi_config(policy: str, faults_path: Path) -> dict:
    """P2P first (it serves requests prefilled elsewhere), then the offload pool."""
    return configs.multi_config(p2p_child(), offload_child(faults_path), policy=policy)
