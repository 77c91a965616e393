"""Clocks: each reporting process's clock offset estimate and whether timelines mix them."""

from typing import Annotated

from fastapi import APIRouter, Query

from kvscope.backend.deps import SessionDep, TokenDep
from kvscope.backend.queries import clocks

router = APIRouter(prefix="/api/v1/clocks", tags=["clocks"], dependencies=[TokenDep])

ThresholdMs = Annotated[
    float,
    Query(gt=0, le=3_600_000, allow_inf_nan=False, description="spread that flags a mix (ms)"),
]


@router.get("", response_model=clocks.Clocks, summary="Clock offset estimate per process")
def clock_offsets(session: SessionDep, threshold_ms: ThresholdMs = clocks.THRESHOLD_MS):
    return clocks.estimate(session.connection(), threshold_ms)
