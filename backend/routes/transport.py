"""P2P transport truth: each read's NIXL/UCX path and rate judged, the window's flags, and a
P/D request's decode-side TTFT split."""

import time

from fastapi import APIRouter, HTTPException

from kvscope.backend.db.request_numbers import numbers_of
from kvscope.backend.deps import SessionDep, SettingsDep, TokenDep
from kvscope.backend.queries import transport
from kvscope.backend.queries.pd_split import PdSplit, split
from kvscope.backend.queries.transport_rates import rates_from
from kvscope.backend.routes.paging import RowId, SinceNs, UntilNs, WindowS
from kvscope.backend.routes.requests import get_request

router = APIRouter(prefix="/api/v1/transport", tags=["transport"], dependencies=[TokenDep])


def _rates(settings):
    try:
        return rates_from(settings.transport_rates)
    except ValueError as exc:
        raise HTTPException(500, f"KVSCOPE_BACKEND_TRANSPORT_RATES: {exc}") from None


def _since(since_ns: int | None, window_s: float) -> int:
    return since_ns if since_ns is not None else time.time_ns() - int(window_s * 1e9)


@router.get(
    "/reads",
    response_model=list[transport.TransportRead],
    summary="P2P reads, newest first, with their NIXL/UCX path, rate and flags",
)
def list_reads(
    session: SessionDep,
    settings: SettingsDep,
    since_ns: SinceNs = None,
    until_ns: UntilNs = None,
    window_s: WindowS = 600.0,
    engine_id: str | None = None,
    request_id: str | None = None,
):
    numbers = numbers_of(request_id) if request_id is not None else None
    since = 0 if request_id is not None and since_ns is None else _since(since_ns, window_s)
    return transport.reads(session, since, until_ns, engine_id, numbers, _rates(settings))


@router.get(
    "/summary",
    response_model=transport.TransportSummary,
    summary="The window's P2P reads: lanes used and reads per flag, with warnings in words",
)
def read_summary(
    session: SessionDep,
    settings: SettingsDep,
    window_s: WindowS = 600.0,
    engine_id: str | None = None,
):
    judged = transport.reads(
        session, _since(None, window_s), None, engine_id, None, _rates(settings)
    )
    return transport.summarize(judged, truncated=len(judged) >= transport.MAX_READS)


@router.get(
    "/requests/{request_key}/split",
    response_model=PdSplit,
    summary="A P/D request's decode-side TTFT: queue, handshake, read and first decode step",
)
def read_split(session: SessionDep, request_key: RowId):
    return split(session, get_request(session, request_key))
