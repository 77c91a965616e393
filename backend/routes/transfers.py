"""Transfers: bytes, duration, throughput, direction and peer of each block transfer."""

from fastapi import APIRouter
from sqlmodel import col, select

from kvscope.backend.db.models import Transfer, TransferPublic
from kvscope.backend.deps import SessionDep, TokenDep
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

router = APIRouter(prefix="/api/v1/transfers", tags=["transfers"], dependencies=[TokenDep])


@router.get("", response_model=Page[TransferPublic], summary="Transfers, newest first")
def list_transfers(
    session: SessionDep,
    since_ns: SinceNs = None,
    until_ns: UntilNs = None,
    direction: str | None = None,
    peer: str | None = None,
    engine_id: str | None = None,
    request_id: str | None = None,
    ok: bool | None = None,
    offset: Offset = 0,
    limit: Limit = 100,
):
    query = select(Transfer).order_by(col(Transfer.start_ns).desc(), col(Transfer.id).desc())
    query = in_window(query, Transfer.start_ns, since_ns, until_ns)
    query = equal(query, direction=direction, peer=peer, engine_id=engine_id, ok=ok)
    query = of_request_id(query, request_id)
    return page(session, query, offset, limit)
