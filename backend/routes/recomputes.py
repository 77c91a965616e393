"""GET /api/v1/stats/recomputes: requests answered normally although a KV load failed and was
recomputed, per engine and cause, with the prefill tokens that cost and the requests' ids."""

import time

from fastapi import APIRouter

from kvscope.backend.deps import SessionDep, TokenDep
from kvscope.backend.queries.recomputes import (
    LONGEST_REQUEST_NS,
    RecomputesPublic,
    silent_recomputes,
)
from kvscope.backend.routes.failures import incidents_in
from kvscope.backend.routes.paging import WindowS

router = APIRouter(prefix="/api/v1/stats", tags=["stats"], dependencies=[TokenDep])


@router.get(
    "/recomputes",
    response_model=RecomputesPublic,
    summary="Silent recomputes: requests that ended normally after a failed, recomputed load",
)
def recomputes(session: SessionDep, window_s: WindowS = 300.0):
    """Requests that ended in the window, grouped by engine and cause."""
    since_ns = time.time_ns() - int(window_s * 1e9)
    # Onwards, as the other stats: a host whose clock runs ahead still counts.
    incidents, _, _ = incidents_in(session, since_ns - LONGEST_REQUEST_NS, None)
    return silent_recomputes(session.connection(), incidents, since_ns, None, window_s)
