"""Failures: load failures, expired leases and failed transfers, with cause and outcome."""

from fastapi import APIRouter
from sqlmodel import select

from kvscope.backend.deps import SessionDep, TokenDep
from kvscope.backend.models import Failure, FailurePublic
from kvscope.backend.routes.paging import Limit, Offset, SinceNs, UntilNs, equal, in_window, page
from kvscope.backend.schemas import Page

router = APIRouter(prefix="/api/v1/failures", tags=["failures"], dependencies=[TokenDep])


@router.get("", response_model=Page[FailurePublic], summary="Failures, newest first")
def list_failures(
    session: SessionDep,
    since_ns: SinceNs = None,
    until_ns: UntilNs = None,
    kind: str | None = None,
    cause: str | None = None,
    engine_id: str | None = None,
    request_id: str | None = None,
    offset: Offset = 0,
    limit: Limit = 100,
):
    query = select(Failure).order_by(Failure.time_ns.desc(), Failure.id.desc())
    query = in_window(query, Failure.time_ns, since_ns, until_ns)
    query = equal(query, kind=kind, cause=cause, engine_id=engine_id, request_id=request_id)
    return page(session, query, offset, limit)
