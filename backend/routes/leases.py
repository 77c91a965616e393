"""Leases: who pins which host blocks, for how long, and how each lease ended."""

import math
import time

from fastapi import APIRouter, Query
from sqlmodel import col, select

from kvscope.backend.db.models import Lease, LeasePublic
from kvscope.backend.deps import SessionDep, SettingsDep, TokenDep
from kvscope.backend.queries import certainty as certainty_module
from kvscope.backend.queries.schemas import LeasesPage
from kvscope.backend.routes.paging import Limit, Offset, equal, page

router = APIRouter(prefix="/api/v1/leases", tags=["leases"], dependencies=[TokenDep])


@router.get(
    "", response_model=LeasesPage, summary="Leases: held ones oldest first, ended newest first"
)
def list_leases(
    session: SessionDep,
    settings: SettingsDep,
    engine_id: str | None = None,
    holder: str | None = None,
    outcome: str | None = None,
    active: bool | None = Query(None, description="only held (true) or ended (false) leases"),
    offset: Offset = 0,
    limit: Limit = 500,
):
    # Held leases oldest first: the oldest are the ones leaking, and a page must not drop them.
    if active:
        query = select(Lease).order_by(col(Lease.acquired_ns), col(Lease.id))
    else:
        query = select(Lease).order_by(col(Lease.acquired_ns).desc(), col(Lease.id).desc())
    query = equal(query, engine_id=engine_id, holder=holder, outcome=outcome)
    if active is not None:
        query = query.where(
            col(Lease.ended_ns).is_(None) if active else col(Lease.ended_ns).is_not(None)
        )
    found = page(session, query, offset, limit)
    certainty = certainty_module.certainty(session, settings.gap_grace_s)
    reasons = certainty_module.uncertain_reasons(certainty.gaps)
    now_ns = time.time_ns()
    found["items"] = [lease_public(lease, now_ns, reasons) for lease in found["items"]]
    found["certainty"] = certainty
    return found


def lease_public(lease: Lease, now_ns: int, reasons: dict[str, str]) -> LeasePublic:
    active = lease.ended_ns is None
    expires_ns = None
    if lease.acquired_ns is not None and lease.timeout_s is not None:
        timeout_ns = lease.timeout_s * 1e9
        if math.isfinite(timeout_ns):  # a span may claim any timeout, even 1e308 s
            expires_ns = lease.acquired_ns + int(timeout_ns)
    age_s = None
    if lease.acquired_ns is not None:
        age_s = ((lease.ended_ns or now_ns) - lease.acquired_ns) / 1e9
    reason = reasons.get(lease.instance_id or "")
    return LeasePublic.model_validate(
        lease,
        update={
            "active": active,
            "age_s": age_s,
            "expires_ns": expires_ns,
            # Past its expiry with no end seen: the expiry event is late or was lost.
            "overdue": active and expires_ns is not None and now_ns > expires_ns,
            "certain": reason is None,
            "uncertain_reason": reason,
        },
    )
