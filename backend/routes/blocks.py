"""Blocks: the current state of every block slot, rebuilt from the span stream."""

import json

from fastapi import APIRouter
from sqlmodel import Session, select

from kvscope.backend import certainty as certainty_module
from kvscope.backend.deps import SessionDep, SettingsDep, TokenDep
from kvscope.backend.models import Block, BlockPublic, Lease
from kvscope.backend.routes.paging import Limit, Offset, equal, page
from kvscope.backend.schemas import BlocksPage

router = APIRouter(prefix="/api/v1/blocks", tags=["blocks"], dependencies=[TokenDep])


@router.get("", response_model=BlocksPage, summary="Block state by engine, tier and slot")
def list_blocks(
    session: SessionDep,
    settings: SettingsDep,
    engine_id: str | None = None,
    tier: str | None = None,
    state: str | None = None,
    block_hash: str | None = None,
    offset: Offset = 0,
    limit: Limit = 500,
):
    query = select(Block).order_by(Block.engine_id, Block.tier, Block.block_id, Block.address)
    query = equal(query, engine_id=engine_id, tier=tier, state=state, block_hash=block_hash)
    found = page(session, query, offset, limit)
    certainty = certainty_module.certainty(session, settings.gap_grace_s)
    reasons = certainty_module.uncertain_reasons(certainty.gaps)
    leases = active_leases_by_block(session)
    found["items"] = [_public(block, leases, reasons) for block in found["items"]]
    found["certainty"] = certainty
    return found


def active_leases_by_block(session: Session) -> dict[tuple[str, int], str]:
    """(engine, host block id) -> id of the active lease pinning it."""
    pinned: dict[tuple[str, int], str] = {}
    active = session.exec(select(Lease).where(Lease.ended_ns.is_(None))).all()
    for lease in active:
        for host_block_id in json.loads(lease.host_block_ids):
            pinned[(lease.engine_id, host_block_id)] = lease.lease_id
    return pinned


def _public(block: Block, leases: dict, reasons: dict[str, str]) -> BlockPublic:
    lease_id = leases.get((block.engine_id, block.block_id)) if block.tier == "host" else None
    reason = reasons.get(block.instance_id or "")
    return BlockPublic.model_validate(
        block,
        update={
            "lease_id": lease_id,
            # A lease pins host blocks exactly while their load to the engine is pending.
            "loading": lease_id is not None,
            "certain": reason is None,
            "uncertain_reason": reason,
        },
    )
