"""A P/D request's decode-side TTFT split into queue, handshake, read and first decode step."""

from __future__ import annotations

from pydantic import BaseModel
from sqlmodel import Session, col, select

from kvscope.backend.db.models import Request, Span, TimelinePoint, Transfer
from kvscope.backend.queries.timeline import TTFT_S, _llm_attributes, of_request
from kvscope.traces import names

MAX_SPANS = 200
"""The most handshake or worker spans read for one request."""


class PdSplit(BaseModel):
    """Arrival on the decode engine to its first token, in consecutive parts that add up.

    queue: arrival until the read was posted, less the handshake (scheduling, lookup,
    allocation, the step that submits the load); handshake: the side channel and NIXL's
    connection to the peer, when this request paid for it; read: the NIXL reads' own window;
    first_decode_step: the last read's end to the end of the step that computed the first
    token (the scheduler seeing the load done, the request resumed, one forward); server: the
    rest of vLLM's own TTFT (its llm_request span), outside the engine's timeline: input
    processing, and the request and its first token passed between API server and engine."""

    request_id: str | None
    ttft_ms: float | None = None  # vLLM's own TTFT where it reported one, else engine_ttft_ms
    engine_ttft_ms: float | None = None  # the engine's arrival to the first token's step end
    server_ms: float | None = None  # ttft_ms less engine_ttft_ms, with vLLM's TTFT only
    queue_ms: float | None = None
    handshake_ms: float = 0.0
    read_ms: float | None = None
    first_decode_step_ms: float | None = None
    reads: int = 0
    missing: list[str] = []  # what the spans lack for a full split


def split(session: Session, request: Request) -> PdSplit:
    result = PdSplit(request_id=request.request_id)
    reads = session.exec(
        select(Transfer)
        .where(*of_request(Transfer, request), Transfer.direction == "p2p_read")
        .order_by(col(Transfer.start_ns))
        .limit(MAX_SPANS)
    ).all()
    if not reads:
        result.missing.append("no P2P read of this request")
        return result
    read_start, read_end = reads[0].start_ns, max(r.end_ns for r in reads)
    result.reads = len(reads)
    handshakes = _spans(session, request, names.SPAN_HANDSHAKE)
    handshake_ns = sum(
        max(0, min(s.end_ns, read_start) - max(s.start_ns, request.start_ns)) for s in handshakes
    )
    resumed = session.exec(
        select(TimelinePoint.time_ns)
        .where(*of_request(TimelinePoint, request), TimelinePoint.point == "resumed")
        .order_by(col(TimelinePoint.time_ns))
        .limit(1)
    ).first()
    # The step that computes the first token starts once the request resumed after its load.
    after = max(read_end, resumed or read_end)
    steps = _spans(session, request, names.SPAN_WORKER_REQUEST, since_ns=after)
    result.handshake_ms = handshake_ns / 1e6
    result.queue_ms = max(0, read_start - request.start_ns - handshake_ns) / 1e6
    result.read_ms = (read_end - read_start) / 1e6
    if not steps:
        result.missing.append("no worker step after the read: the first token is not recorded")
        return result
    first_token_ns = min(s.end_ns for s in steps)
    result.first_decode_step_ms = (first_token_ns - read_end) / 1e6
    result.engine_ttft_ms = result.ttft_ms = (first_token_ns - request.start_ns) / 1e6
    vllm_ttft_s = _llm_attributes(session, request).get(TTFT_S)
    if isinstance(vllm_ttft_s, int | float):
        result.ttft_ms = vllm_ttft_s * 1e3
        result.server_ms = result.ttft_ms - result.engine_ttft_ms
    return result


def _spans(session: Session, request: Request, name: str, since_ns: int = 0) -> list[Span]:
    query = select(Span).where(*of_request(Span, request), Span.name == name)
    query = query.where(Span.start_ns >= since_ns)
    return list(session.exec(query.order_by(col(Span.start_ns)).limit(MAX_SPANS)).all())
