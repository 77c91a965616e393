"""The P2P connector's own spans: handshakes with a peer, in the trace of the request that asked."""

from opentelemetry import trace

from kvscope.traces import names
from kvscope.traces.context import context_of
from kvscope.traces.events import monotonic_to_epoch_ns
from kvscope.traces.spans import get_tracer


def record_handshake(
    req_id: str, peer: tuple[str, int, str], start_s: float, end_s: float, error: str | None
) -> None:
    """A kvscope.handshake span timed by the monotonic clock; peer is (host, port, engine id)."""
    _host, _port, engine_id = peer
    span = get_tracer().start_span(
        names.SPAN_HANDSHAKE,
        context=context_of(req_id),
        start_time=monotonic_to_epoch_ns(start_s),
        attributes={
            names.REQUEST_ID: req_id,
            names.TRANSFER_PEER: engine_id,
            names.TRANSFER_DURATION_MS: (end_s - start_s) * 1000,
            names.TRANSFER_OK: error is None,
        },
    )
    if error is not None:
        span.set_status(trace.StatusCode.ERROR, error)
        span.set_attribute(names.FAILURE_CAUSE, error)
    span.end(end_time=monotonic_to_epoch_ns(end_s))
