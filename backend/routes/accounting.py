"""GET /api/v1/stats/accounting: per request, prefix-cache hits + external hits by tier +
computed tokens against the prompt; per engine totals, the hit rate and the violations."""

import time

from fastapi import APIRouter

from kvscope.backend.deps import SessionDep, TokenDep
from kvscope.backend.queries.accounting import AccountingPublic, accounting
from kvscope.backend.routes.paging import WindowS

router = APIRouter(prefix="/api/v1/stats", tags=["stats"], dependencies=[TokenDep])


@router.get(
    "/accounting",
    response_model=AccountingPublic,
    summary="Token accounting: hits by source + computed = prompt, per request and engine",
)
def token_accounting(session: SessionDep, window_s: WindowS = 300.0):
    """Requests that ended in the window (onwards, as the other stats)."""
    since_ns = time.time_ns() - int(window_s * 1e9)
    return accounting(session.connection(), since_ns, None, window_s)
