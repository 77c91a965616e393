"""What an engine still holds after a cell (harness/leaks.py's check), and whom it knows."""

from typing import Any

from kvscope.harness.engine_state import connector_cores, worker_connector
from kvscope.harness.leaks import engine_leaks

__all__ = ["engine_leaks", "knows_peer"]  # the matrix imports engine_leaks from here


def knows_peer(llm: Any, peer_engine_id: str) -> bool:
    """Whether the decode side holds a NIXL connection to that prefill engine."""
    for _, core in connector_cores(worker_connector(llm)):
        puller = getattr(getattr(core, "worker", None), "puller", None)
        if puller is not None and peer_engine_id in puller.connected_engines():
            return True
    return False
