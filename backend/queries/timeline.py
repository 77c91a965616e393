"""A request's KV timeline and time-to-first-token breakdown, read from stored rows."""

import json

from sqlmodel import Session, col, select

from kvscope.backend.db.models import (
    Failure,
    FailurePublic,
    Request,
    RequestPublic,
    Span,
    TimelinePoint,
    TimelinePointPublic,
    Transfer,
    TransferPublic,
)
from kvscope.backend.db.request_numbers import numbers_of
from kvscope.backend.queries.schemas import Certainty, Timeline, TtftBreakdown
from kvscope.traces import names

LLM_REQUEST = "llm_request"
TTFT_S = "gen_ai.latency.time_to_first_token"
QUEUE_S = "gen_ai.latency.time_in_queue"
# These points take their last occurrence: a lookup may be repeated until it decides.
_LAST_WINS = {"lookup_result", "finished"}


def request_public(request: Request) -> RequestPublic:
    duration = (request.end_ns - request.start_ns) / 1e6 if request.end_ns else None
    return RequestPublic.model_validate(request, update={"duration_ms": duration})


def build(session: Session, request: Request, certainty: Certainty) -> Timeline:
    points = _points(session, request)
    first: dict[str, int] = {}
    for point in points:
        if point.point in _LAST_WINS or point.point not in first:
            first[point.point] = point.time_ns
    transfers = session.exec(
        select(Transfer).where(*of_request(Transfer, request)).order_by(col(Transfer.start_ns))
    ).all()
    failures = session.exec(
        select(Failure).where(*of_request(Failure, request)).order_by(col(Failure.time_ns))
    ).all()
    return Timeline(
        request=request_public(request),
        points=[TimelinePointPublic.model_validate(point) for point in points],
        first=first,
        missing_points=[p for p in names.TIMELINE_POINTS if p not in first],
        ttft=breakdown(request, first, _llm_attributes(session, request)),
        transfers=[TransferPublic.model_validate(transfer) for transfer in transfers],
        failures=[FailurePublic.model_validate(failure) for failure in failures],
        certainty=certainty,
    )


def of_request(model, request: Request) -> list:
    """Conditions selecting one request's rows (spans, timeline points, transfers, failures):
    its request id on its engine, or on none, found by their request numbers.

    A trace is only a link: clients (agent frameworks) reuse one trace for many requests, so
    joining by trace would show other requests' failures. Rows from before a request id was
    known (none carry it) fall back to the trace.
    """
    if request.request_id is None:
        return [model.trace_id == request.trace_id]
    engines = None if request.engine_id is None else (request.engine_id, "")
    return [model.request_no.in_(numbers_of(request.request_id, engines))]


def _points(session: Session, request: Request) -> list[TimelinePoint]:
    query = select(TimelinePoint).where(*of_request(TimelinePoint, request))
    return list(
        session.exec(query.order_by(col(TimelinePoint.time_ns), col(TimelinePoint.id))).all()
    )


def _llm_attributes(session: Session, request: Request) -> dict:
    """vLLM's llm_request span carries the API server's id: ours minus the '-xxxxxxxx' tail."""
    if request.request_id is None:
        return {}
    candidates = [request.request_id]
    head, dash, tail = request.request_id.rpartition("-")
    if dash and len(tail) == 8:
        candidates.append(head)
    numbers = numbers_of(candidates)
    span = session.exec(
        select(Span)
        .where(col(Span.request_no).in_(numbers), col(Span.name) == LLM_REQUEST)
        .limit(1)
    ).first()
    return json.loads(span.attributes) if span else {}


def _ms(later: int | None, earlier: int | None) -> float | None:
    if later is None or earlier is None:
        return None
    return max(0.0, (later - earlier) / 1e6)


def breakdown(request: Request, first: dict[str, int], llm: dict) -> TtftBreakdown:
    """Queue + lookup + waiting for KV + compute = TTFT, each part with where it came from."""
    result = TtftBreakdown()
    sources: dict[str, str] = {}
    if isinstance(llm.get(QUEUE_S), int | float):
        result.queue_ms, sources["queue_ms"] = llm[QUEUE_S] * 1e3, QUEUE_S
    elif (queue := _ms(first.get("lookup_start"), request.start_ns)) is not None:
        result.queue_ms, sources["queue_ms"] = queue, "request span start to lookup_start"
    result.lookup_ms = _ms(first.get("lookup_result"), first.get("lookup_start"))
    if result.lookup_ms is not None:
        sources["lookup_ms"] = "lookup_start to lookup_result"
    loaded = first.get("transfer_complete", first.get("resumed"))
    if "blocks_allocated" not in first:
        result.kv_wait_ms, sources["kv_wait_ms"] = 0.0, "no external KV to load"
    elif loaded is not None:
        result.kv_wait_ms = _ms(loaded, first["blocks_allocated"])
        sources["kv_wait_ms"] = "blocks_allocated to transfer_complete (or resumed)"
    if isinstance(llm.get(TTFT_S), int | float):
        result.ttft_ms, sources["ttft_ms"] = llm[TTFT_S] * 1e3, TTFT_S
        parts = [result.queue_ms, result.lookup_ms, result.kv_wait_ms]
        result.compute_ms = max(0.0, result.ttft_ms - sum(p for p in parts if p))
        sources["compute_ms"] = "ttft minus queue, lookup and KV wait"
    result.sources = sources
    return result
