"""Why prompt tokens missed the tiers (per engine and per request) and the tiers' alarms."""

import time
from typing import Annotated

from fastapi import APIRouter, HTTPException, Query

from kvscope.backend.db.models import Request
from kvscope.backend.deps import SessionDep, TokenDep
from kvscope.backend.queries.misses.alarms import TierAlarmsPublic, tier_alarms
from kvscope.backend.queries.misses.explain import RequestMisses
from kvscope.backend.queries.misses.report import (
    HISTORY_S,
    MissesPublic,
    misses,
    request_misses,
)
from kvscope.backend.routes.paging import RowId, WindowS

router = APIRouter(prefix="/api/v1", tags=["stats"], dependencies=[TokenDep])

HistoryS = Annotated[
    float,
    Query(
        gt=0,
        le=86400,
        description="seconds of the pools' stores and evictions read before the window",
    ),
]


@router.get(
    "/stats/misses",
    response_model=MissesPublic,
    summary="Why prompt tokens missed the tiers: per engine as shares, the newest requests",
)
def miss_reasons(session: SessionDep, window_s: WindowS = 300.0, history_s: HistoryS = HISTORY_S):
    """Requests that ended in the window; each one's missed tokens (prompt minus what a tier
    served) by reason, adding up to them."""
    since_ns = time.time_ns() - int(window_s * 1e9)
    return misses(session.connection(), since_ns, None, window_s, history_s)


@router.get(
    "/stats/tier-alarms",
    response_model=TierAlarmsPublic,
    summary="Host tiers written and never read, blocks evicted unread, idle and reuse times",
)
def alarms(session: SessionDep, window_s: WindowS = 600.0, history_s: HistoryS = HISTORY_S):
    since_ns = time.time_ns() - int(window_s * 1e9)
    return tier_alarms(session.connection(), since_ns, None, window_s, history_s)


@router.get(
    "/requests/{request_key}/misses",
    response_model=RequestMisses,
    summary="One request's missed tokens by reason",
)
def one_request(session: SessionDep, request_key: RowId, history_s: HistoryS = HISTORY_S):
    request = session.get(Request, request_key)
    if request is None:
        raise HTTPException(404, f"no request with id {request_key}: list them at /api/v1/requests")
    if request.end_ns is None or request.status == "running":
        raise HTTPException(409, f"request {request_key} is still running: ask when it ended")
    found = request_misses(session.connection(), request_key, request.end_ns, history_s)
    if found is None:
        raise HTTPException(
            404, f"request {request_key} was not accounted (no decided lookup or prompt length)"
        )
    return found
