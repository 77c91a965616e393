"""Failures: each report (load failures, expired leases, failed transfers) and the incidents
they fold into, with cause, policy and outcome."""

from fastapi import APIRouter
from sqlmodel import Session, col, select

from kvscope.backend.db.models import Failure, FailurePublic, Lease, Process
from kvscope.backend.deps import SessionDep, TokenDep
from kvscope.backend.queries.incidents import IncidentPublic, fold
from kvscope.backend.queries.schemas import Page
from kvscope.backend.routes.paging import (
    Limit,
    Offset,
    SinceNs,
    UntilNs,
    equal,
    in_window,
    of_request_id,
    page,
)

router = APIRouter(prefix="/api/v1/failures", tags=["failures"], dependencies=[TokenDep])

MAX_REPORTS = 20_000
"""Reports folded per call: failures are rare, and a window with more says it was cut."""


class IncidentsPage(Page[IncidentPublic]):
    reports: int
    truncated: bool


@router.get("", response_model=Page[FailurePublic], summary="Failure reports, newest first")
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
    query = select(Failure).order_by(col(Failure.time_ns).desc(), col(Failure.id).desc())
    query = in_window(query, Failure.time_ns, since_ns, until_ns)
    query = of_request_id(equal(query, kind=kind, cause=cause, engine_id=engine_id), request_id)
    return page(session, query, offset, limit)


def incidents_in(
    session: Session,
    since_ns: int | None,
    until_ns: int | None,
    request_id: str | None = None,
    **filters,
) -> tuple[list[IncidentPublic], int, bool]:
    """Incidents of the window's newest MAX_REPORTS reports: (incidents, reports, truncated)."""
    query = select(Failure).order_by(col(Failure.time_ns).desc(), col(Failure.id).desc())
    query = in_window(query, Failure.time_ns, since_ns, until_ns)
    query = of_request_id(equal(query, **filters), request_id)
    reports = session.exec(query.limit(MAX_REPORTS + 1)).all()
    truncated = len(reports) > MAX_REPORTS
    reports = _with_engines(session, _with_holders(session, reports[:MAX_REPORTS]))
    return fold(reports), len(reports), truncated


def _with_engines(session: Session, reports: list[FailurePublic]) -> list[FailurePublic]:
    """A report from a span without an engine id names its process: name the engine instead."""
    rows = session.exec(select(Process.instance_id, Process.engine_id)).all()
    engine_of = {instance: engine for instance, engine in rows if engine}
    return [
        r.model_copy(update={"engine_id": engine_of[r.engine_id]})
        if r.engine_id in engine_of
        else r
        for r in reports
    ]


def _with_holders(session: Session, reports: list[Failure]) -> list[FailurePublic]:
    """Copies of the reports; an expired lease's report names no request, its lease does."""
    public = [FailurePublic.model_validate(report) for report in reports]
    wanted = {(r.engine_id, r.lease_id) for r in public if r.lease_id and not r.request_id}
    if not wanted:
        return public
    leases = session.exec(
        select(Lease.engine_id, Lease.lease_id, Lease.holder).where(
            col(Lease.lease_id).in_({lease_id for _, lease_id in wanted})
        )
    ).all()
    holders: dict[tuple[str | None, str | None], str] = {
        (engine, lease): holder for engine, lease, holder in leases if holder
    }
    return [
        r.model_copy(update={"request_id": holders.get((r.engine_id, r.lease_id))})
        if r.lease_id and not r.request_id
        else r
        for r in public
    ]


@router.get(
    "/incidents",
    response_model=IncidentsPage,
    summary="Failure incidents, newest first: one row per fault, its reports folded in",
)
def list_incidents(
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
    found, reports, truncated = incidents_in(
        session, since_ns, until_ns, engine_id=engine_id, request_id=request_id
    )
    found = [i for i in found if (kind is None or i.kind == kind)]
    found = [i for i in found if (cause is None or i.cause == cause)]
    return IncidentsPage(
        items=found[offset : offset + limit],
        total=len(found),
        offset=offset,
        limit=limit,
        reports=reports,
        truncated=truncated,
    )
