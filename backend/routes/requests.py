"""Requests: the list with filters, one request, its KV timeline and its spans."""

import json

from fastapi import APIRouter, HTTPException, Query
from sqlmodel import Session, col, select

from kvscope.backend.db.models import Request, RequestPublic, Span, SpanPublic
from kvscope.backend.deps import SessionDep, SettingsDep, TokenDep
from kvscope.backend.queries import certainty as certainty_module
from kvscope.backend.queries.schemas import Page, Timeline
from kvscope.backend.queries.timeline import build, of_request, request_public
from kvscope.backend.routes.paging import (
    Limit,
    Offset,
    RowId,
    SinceNs,
    UntilNs,
    equal,
    in_window,
    of_request_id,
    page,
)

router = APIRouter(prefix="/api/v1/requests", tags=["requests"], dependencies=[TokenDep])


@router.get("", response_model=Page[RequestPublic], summary="Requests, newest first")
def list_requests(
    session: SessionDep,
    since_ns: SinceNs = None,
    until_ns: UntilNs = None,
    status: str | None = Query(None, description="running, finished_stopped, error, ..."),
    connector: str | None = None,
    engine_id: str | None = None,
    request_id: str | None = None,
    offset: Offset = 0,
    limit: Limit = 100,
):
    query = select(Request).order_by(col(Request.start_ns).desc(), col(Request.id).desc())
    query = in_window(query, Request.start_ns, since_ns, until_ns)
    query = equal(query, status=status, connector=connector, engine_id=engine_id)
    query = of_request_id(query, request_id)
    found = page(session, query, offset, limit)
    found["items"] = [request_public(r) for r in found["items"]]
    return found


def get_request(session: Session, request_key: int) -> Request:
    request = session.get(Request, request_key)
    if request is None:
        raise HTTPException(404, f"no request with id {request_key}: list them at /api/v1/requests")
    return request


@router.get("/{request_key}", response_model=RequestPublic)
def read_request(session: SessionDep, request_key: RowId):
    return request_public(get_request(session, request_key))


@router.get(
    "/{request_key}/timeline",
    response_model=Timeline,
    summary="KV timeline points and time-to-first-token breakdown",
)
def read_timeline(session: SessionDep, settings: SettingsDep, request_key: RowId):
    request = get_request(session, request_key)
    origins = session.exec(
        select(Span.instance_id).where(*of_request(Span, request)).distinct()
    ).all()
    certainty = certainty_module.certainty(
        session, settings.gap_grace_s, [o for o in origins if o] or [request.instance_id or ""]
    )
    return build(session, request, certainty)


@router.get(
    "/{request_key}/spans",
    response_model=list[SpanPublic],
    summary="Every stored span of the request (its request id on its engine), in start order",
)
def read_spans(session: SessionDep, request_key: RowId, limit: Limit = 1000):
    request = get_request(session, request_key)
    spans = session.exec(
        select(Span).where(*of_request(Span, request)).order_by(col(Span.start_ns)).limit(limit)
    ).all()
    return [
        SpanPublic.model_validate(
            span,
            update={
                "attributes": json.loads(span.attributes),
                "events": json.loads(span.events),
                "links": json.loads(span.links),
            },
        )
        for span in spans
    ]
