"""The P2P connector's own spans: handshakes with a peer, in the trace of the request that asked."""

from kvscope.traces import names
from kvscope.traces.events import record_timed_span


def record_handshake(
    req_id: str, peer: tuple[str, int, str], start_s: float, end_s: float, error: str | None
) -> None:
    """A kvscope.handshake span timed by the monotonic clock; peer is (host, port, engine id)."""
    _host, _port, engine_id = peer
    attributes = {names.TRANSFER_PEER: engine_id}
    record_timed_span(names.SPAN_HANDSHAKE, req_id, start_s, end_s, error, attributes)
