"""Blocks: the current state of every block slot, rebuilt from the span stream."""

import json
from typing import Annotated

from fastapi import APIRouter, Query
from sqlmodel import Session, col, or_, select

from kvscope.backend.db.models import Block, BlockPublic, Lease
from kvscope.backend.deps import SessionDep, SettingsDep, TokenDep
from kvscope.backend.queries import certainty as certainty_module
from kvscope.backend.queries.schemas import BlocksPage
from kvscope.backend.routes.paging import MAX_INT64, Limit, Offset, equal, page

router = APIRouter(prefix="/api/v1/blocks", tags=["blocks"], dependencies=[TokenDep])

KvGroup = Annotated[
    int | None, Query(ge=0, le=MAX_INT64, description="only this KV cache group's blocks")
]


@router.get("", response_model=BlocksPage, summary="Block state by engine, tier and slot")
def list_blocks(
    session: SessionDep,
    settings: SettingsDep,
    engine_id: str | None = None,
    tier: str | None = None,
    state: str | None = None,
    block_hash: str | None = None,
    kv_group: KvGroup = None,
    offset: Offset = 0,
    limit: Limit = 500,
):
    order = (
        col(Block.engine_id),
        col(Block.tier),
        col(Block.kv_group),
        col(Block.block_id),
        col(Block.address),
    )
    query = select(Block).order_by(*order)
    query = equal(query, engine_id=engine_id, tier=tier, state=state, block_hash=block_hash)
    if kv_group == 0:  # rows stored before groups were named (NULL) are group 0
        query = query.where(or_(col(Block.kv_group) == 0, col(Block.kv_group).is_(None)))
    elif kv_group is not None:
        query = query.where(Block.kv_group == kv_group)
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
    active = session.exec(select(Lease).where(col(Lease.ended_ns).is_(None))).all()
    for lease in active:
        for host_block_id in json.loads(lease.host_block_ids):
            pinned[(lease.engine_id, host_block_id)] = lease.lease_id
    return pinned


def _public(block: Block, leases: dict, reasons: dict[str, str]) -> BlockPublic:
    # Host slots are one pool for every group: a lease pins the slot, not an evicted copy.
    pinnable = block.tier == "host" and block.state != "evicted"
    lease_id = leases.get((block.engine_id, block.block_id)) if pinnable else None
    reason = reasons.get(block.instance_id or "")
    return BlockPublic.model_validate(
        block,
        update={
            "kv_group": block.kv_group or 0,
            "lease_id": lease_id,
            # A lease pins host blocks exactly while their load to the engine is pending.
            "loading": lease_id is not None,
            "certain": reason is None,
            "uncertain_reason": reason,
        },
    )
