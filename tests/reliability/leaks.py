"""What an engine still holds after a cell (harness/leaks.py's check), and whom it knows."""

from typing import Any

from kvscope.harness.engine_state import connector_cores, worker_connector
from kvscope.harness.leaks import engine_leaks

__all__ = ["engine_leaks", "knows_peer"]  # the matrix imports engine_leaks from here


def knows_peer(llm: Any, peer_engine_id: str) -> bool:
    """Whether the decode side holds a NIXL connection to that prefill engine."""
    for _, core in connector_cores(worker_connector(llm)):
        puller = getattr(getattr(core, "worker", None), "puller", None)
        # The puller's peers (side-channel host, port, engine id -> NIXL agent) have no public
        # reader: this is a probe of the P2P worker's connection cache, not a leak check.
        if puller is not None and any(key[2] == peer_engine_id for key in puller._peers):
            return True
    return False
