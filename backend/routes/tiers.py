"""Tier health: the latest state of every KV tier (offload pool, P2P peer) per engine."""

from fastapi import APIRouter

from kvscope.backend.deps import SessionDep, TokenDep
from kvscope.backend.queries import tiers

router = APIRouter(prefix="/api/v1/tiers", tags=["tiers"], dependencies=[TokenDep])


@router.get(
    "",
    response_model=list[tiers.TierHealth],
    summary="Latest health state per engine and tier, bypassed first",
)
def list_tiers(session: SessionDep):
    return tiers.latest(session.connection())
