"""GET /api/v1/plan: what-if sizing of each engine's host pool, replayed from the window's spans."""

import time
from typing import Annotated

from fastapi import APIRouter, HTTPException, Query

from kvscope.backend.deps import SessionDep, TokenDep
from kvscope.backend.queries.plan.report import FACTORS, sizing
from kvscope.backend.queries.plan.schemas import SizingPublic
from kvscope.backend.routes.paging import WindowS

router = APIRouter(prefix="/api/v1", tags=["plan"], dependencies=[TokenDep])


@router.get(
    "/plan",
    response_model=SizingPublic,
    summary="Host pool sizing: hit tokens, time saved and TTFT at other sizes and policies, the "
    "infinite-pool ceiling and the knee",
)
def plan(
    session: SessionDep,
    window: WindowS = 3600.0,
    sizes: Annotated[
        str | None, Query(description="comma-separated multiples of today's pool size")
    ] = None,
):
    """Each engine's recorded lookups and stores replayed at each size under each policy, at a
    pool that never evicts (the ceiling) and, per policy, at the smallest pool within 1% of it
    (the knee, found to size_step_blocks). Cost: at most log2(ceiling's pool) + 8 replays per
    policy beyond the sizes asked, each linear in the window's pool events."""
    factors = _factors(sizes) if sizes else FACTORS
    until_ns = time.time_ns()
    since_ns = until_ns - int(window * 1e9)
    return sizing(session.connection(), since_ns, until_ns + 10**12, window, factors)


def _factors(sizes: str) -> tuple[float, ...]:
    try:
        factors = tuple(float(size) for size in sizes.split(",") if size.strip())
    except ValueError as error:
        raise HTTPException(
            422, f"sizes must be numbers separated by commas, got {sizes!r}"
        ) from error
    if not factors or len(factors) > 16 or not all(0 < f <= 64 for f in factors):
        raise HTTPException(422, "sizes: 1 to 16 multiples, each above 0 and at most 64")
    return factors
