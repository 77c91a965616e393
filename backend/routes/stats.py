"""Summary statistics over a recent window: requests, TTFT, transfers, failures, state."""

import json
import statistics
import time

from fastapi import APIRouter
from sqlalchemy import case
from sqlmodel import Session, func, select

from kvscope.backend import certainty
from kvscope.backend.deps import SessionDep, SettingsDep, TokenDep
from kvscope.backend.models import Block, Failure, Lease, Request, Span, TimelinePoint, Transfer
from kvscope.backend.routes.paging import WindowS
from kvscope.backend.schemas import HitRate, Summary
from kvscope.backend.timeline import LLM_REQUEST, TTFT_S
from kvscope.traces import names

router = APIRouter(prefix="/api/v1/stats", tags=["stats"], dependencies=[TokenDep])

MAX_TTFT_SAMPLES = 10_000
LOOKUP_HOOK = names.SPAN_HOOK_PREFIX + "get_num_new_matched_tokens"


@router.get("/summary", response_model=Summary, summary="Counts and rates over a window")
def summary(
    session: SessionDep,
    settings: SettingsDep,
    window_s: WindowS = 300.0,
):
    since_ns = time.time_ns() - int(window_s * 1e9)
    p50, p95 = _ttft_percentiles(session, since_ns)
    return Summary(
        window_s=window_s,
        since_ns=since_ns,
        requests=_count_by(session, Request.status, Request.start_ns >= since_ns),
        ttft_ms_p50=p50,
        ttft_ms_p95=p95,
        external_hit_tokens=session.exec(
            select(func.coalesce(func.sum(TimelinePoint.value), 0)).where(
                TimelinePoint.point == "lookup_result", TimelinePoint.time_ns >= since_ns
            )
        ).one(),
        transfers=_transfers(session, since_ns),
        failures=_count_by(session, Failure.kind, Failure.time_ns >= since_ns),
        leases_active=session.exec(
            select(func.count()).select_from(Lease).where(Lease.ended_ns.is_(None))
        ).one(),
        blocks=_blocks(session),
        spans=session.exec(
            select(func.count()).select_from(Span).where(Span.start_ns >= since_ns)
        ).one(),
        streams_incomplete=len({g.origin for g in certainty.gaps(session, settings.gap_grace_s)}),
    )


@router.get(
    "/hits", response_model=list[HitRate], summary="External hit rate per connector and child"
)
def hits(
    session: SessionDep,
    window_s: WindowS = 300.0,
):
    """Each request's last decided lookup in the window, grouped by connector and child."""
    since_ns = time.time_ns() - int(window_s * 1e9)
    rows = session.exec(
        select(Span.engine_id, Span.request_id, Span.attributes)
        .where(Span.name == LOOKUP_HOOK, Span.start_ns >= since_ns)
        .order_by(Span.start_ns)
        .limit(MAX_TTFT_SAMPLES)
    ).all()
    decided: dict[tuple, tuple] = {}
    for engine_id, request_id, text in rows:
        attributes = json.loads(text)
        hit = attributes.get(names.TOKENS_EXTERNAL_HIT)
        if isinstance(hit, int):  # None while the connector is still deciding
            group = (attributes.get(names.CONNECTOR_NAME), attributes.get(names.CONNECTOR_CHILD))
            decided[(engine_id, request_id, *group)] = (group, hit)
    prompts = _prompt_tokens(session, {key[1] for key in decided})
    totals: dict[tuple, list[int]] = {}
    for (engine_id, request_id, *_), (group, hit) in decided.items():
        total = totals.setdefault(group, [0, 0, 0, 0])
        total[0] += 1
        total[1] += hit > 0
        total[2] += hit
        total[3] += prompts.get((engine_id, request_id), 0)
    return [
        HitRate(
            connector=connector,
            child=child,
            requests=n,
            hit_requests=hit_n,
            external_hit_tokens=tokens,
            prompt_tokens=prompt,
        )
        for (connector, child), (n, hit_n, tokens, prompt) in sorted(totals.items(), key=str)
    ]


def _prompt_tokens(session: Session, request_ids: set) -> dict[tuple, int]:
    rows = session.exec(
        select(Request.engine_id, Request.request_id, Request.prompt_tokens).where(
            Request.request_id.in_([r for r in request_ids if r is not None])
        )
    ).all()
    return {(engine, req): tokens or 0 for engine, req, tokens in rows}


def _count_by(session: Session, column, condition) -> dict[str, int]:
    rows = session.exec(select(column, func.count()).where(condition).group_by(column)).all()
    return {str(key): count for key, count in rows}


def _ttft_percentiles(session: Session, since_ns: int) -> tuple[float | None, float | None]:
    rows = session.exec(
        select(Span.attributes)
        .where(Span.name == LLM_REQUEST, Span.start_ns >= since_ns)
        .order_by(Span.start_ns.desc())
        .limit(MAX_TTFT_SAMPLES)
    ).all()
    samples = sorted(
        value * 1e3
        for value in (json.loads(text).get(TTFT_S) for text in rows)
        if isinstance(value, int | float)
    )
    if not samples:
        return None, None
    if len(samples) == 1:
        return samples[0], samples[0]
    cuts = statistics.quantiles(samples, n=20, method="inclusive")
    return statistics.median(samples), cuts[18]


def _transfers(session: Session, since_ns: int) -> dict[str, dict[str, float]]:
    rows = session.exec(
        select(
            Transfer.direction,
            func.count(),
            func.coalesce(func.sum(Transfer.bytes), 0),
            func.avg(Transfer.gbps),
            func.sum(case((Transfer.ok.is_(False), 1), else_=0)),
        )
        .where(Transfer.start_ns >= since_ns)
        .group_by(Transfer.direction)
    ).all()
    return {
        str(direction): {
            "count": count,
            "bytes": total,
            "mean_gbps": mean or 0.0,
            "failed": failed or 0,
        }
        for direction, count, total, mean, failed in rows
    }


def _blocks(session: Session) -> dict[str, dict[str, int]]:
    rows = session.exec(
        select(Block.tier, Block.state, func.count()).group_by(Block.tier, Block.state)
    ).all()
    found: dict[str, dict[str, int]] = {}
    for tier, state, count in rows:
        found.setdefault(tier, {})[state] = count
    return found
