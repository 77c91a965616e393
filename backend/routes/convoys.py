"""GET /api/v1/stats/convoys: loads that queued behind another request's load of the same host
blocks, per engine over a window, with the newest ones."""

import time

from fastapi import APIRouter

from kvscope.backend.deps import SessionDep, TokenDep
from kvscope.backend.queries.convoys import ConvoysPublic, load_convoys
from kvscope.backend.routes.paging import WindowS

router = APIRouter(prefix="/api/v1/stats", tags=["stats"], dependencies=[TokenDep])


@router.get(
    "/convoys",
    response_model=ConvoysPublic,
    summary="Load convoys: loads that waited behind another request's load of the same blocks",
)
def convoys(session: SessionDep, window_s: WindowS = 300.0):
    """Convoys whose wait began in the last window_s seconds, per engine."""
    now_ns = time.time_ns()
    # Onwards, as the other stats: a host whose clock runs ahead still counts.
    return load_convoys(session.connection(), now_ns - int(window_s * 1e9), 2**63 - 1, window_s)
