"""What an engine still holds after a cell, read from the connectors' own state and vLLM's."""

from typing import Any

from kvscope.harness.engine_state import worker_connector
from kvscope.verify.leaks import engine_leaks  # noqa: F401 (the matrix imports it from here)


def knows_peer(llm: Any, peer_engine_id: str) -> bool:
    """Whether the decode side holds a NIXL connection to that prefill engine."""
    worker_half = worker_connector(llm)
    cores = [c.connector for c in getattr(worker_half, "children", [])] or [worker_half]
    pullers = [c.worker.puller for c in cores if type(c).__name__ == "P2PCore"]
    return any(key[2] == peer_engine_id for puller in pullers for key in puller._peers)
