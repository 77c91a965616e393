"""Summary statistics over a recent window: requests, TTFT, hits, transfers, failures, state."""

import time

from fastapi import APIRouter, Query

from kvscope.backend.db import span_counts
from kvscope.backend.db.rollups import RESOLUTION_NS
from kvscope.backend.deps import SessionDep, SettingsDep, TokenDep
from kvscope.backend.queries import aggregates as sql
from kvscope.backend.queries import certainty, series, tiers
from kvscope.backend.queries.engines import EnginePublic, engines
from kvscope.backend.queries.schemas import HitRate, Summary
from kvscope.backend.queries.series import Series
from kvscope.backend.routes.failures import incidents_in
from kvscope.backend.routes.paging import MAX_INT64, WindowS
from kvscope.traces.hit_rate import hit_rate

router = APIRouter(prefix="/api/v1/stats", tags=["stats"], dependencies=[TokenDep])


def bounds_of(window_s: float, step_s: float | None = None) -> dict:
    """From window_s ago; with a step, from the whole second before (the rollups' resolution)
    until the end of the step holding now, else onwards (a host whose clock runs ahead still
    counts)."""
    now_ns = time.time_ns()
    since_ns = now_ns - int(window_s * 1e9)
    if step_s is None:
        return sql.window(since_ns, MAX_INT64)
    since_ns -= since_ns % RESOLUTION_NS
    step_ns = max(1, int(step_s * 1e9))
    return sql.window(
        since_ns, since_ns + -(-(now_ns + 1 - since_ns) // step_ns) * step_ns, step_ns
    )


@router.get("/summary", response_model=Summary, summary="Counts and rates over a window")
def summary(session: SessionDep, settings: SettingsDep, window_s: WindowS = 300.0):
    connection = session.connection()
    bounds = bounds_of(window_s)
    ttft = sorted(ms for _, ms in sql.rows(connection, sql.TTFT_SAMPLES, bounds))
    p50, p95 = sql.percentiles(ttft)
    incidents, _, _ = incidents_in(session, bounds["since"], bounds["until"])
    failures: dict[str, int] = {}
    for incident in incidents:
        failures[incident.kind] = failures.get(incident.kind, 0) + 1
    blocks: dict[str, dict[str, int]] = {}
    for tier, state, count in sql.rows(connection, sql.BLOCKS_BY_STATE, {}):
        blocks.setdefault(tier, {})[state] = count
    return Summary(
        window_s=window_s,
        since_ns=bounds["since"],
        requests=sql.counted(connection, sql.REQUESTS_BY_STATUS, bounds),
        ttft_ms_p50=p50,
        ttft_ms_p95=p95,
        # The composite's (or a plain connector's) lookups, each request's last one, from the
        # series' per-second rollups (the window from its whole second): a child's hit is inside.
        external_hit_tokens=connection.execute(
            sql.ROLLED_HIT_TOKENS,
            {**bounds, "since": bounds["since"] - bounds["since"] % RESOLUTION_NS},
        ).scalar_one(),
        transfers=_transfers(connection, bounds),
        failures=failures,
        leases_active=connection.execute(sql.LEASES_HELD).scalar_one(),
        blocks=blocks,
        spans=span_counts.in_window(connection, bounds["since"], bounds["until"]),
        streams_incomplete=len({g.origin for g in certainty.gaps(session, settings.gap_grace_s)}),
        tiers_bypassed=sum(t.state != "healthy" for t in tiers.latest(connection)),
    )


@router.get(
    "/hits", response_model=list[HitRate], summary="External hit rate per connector and child"
)
def hits(session: SessionDep, window_s: WindowS = 300.0):
    """Each request's last decided lookup in the window, grouped by connector and child."""
    return hit_rates(session, window_s)


def hit_rates(session, window_s: float) -> list[HitRate]:
    found = sql.rows(session.connection(), sql.HITS_BY_CONNECTOR, bounds_of(window_s))
    return [
        HitRate(
            connector=connector,
            child=child,
            requests=n,
            hit_requests=hit_n or 0,
            external_hit_tokens=tokens or 0,
            prompt_tokens=prompt or 0,
            hit_rate=hit_rate(tokens or 0, prompt or 0),
        )
        for connector, child, n, hit_n, tokens, prompt in sorted(found, key=str)
    ]


def _transfers(connection, bounds: dict) -> dict[str, dict[str, float]]:
    return {
        str(direction): {
            "count": count,
            "bytes": total,
            "mean_gbps": mean or 0.0,
            "failed": failed or 0,
        }
        for direction, count, total, mean, failed in sql.rows(
            connection, sql.TRANSFERS_BY_DIRECTION, bounds
        )
    }


@router.get(
    "/series",
    response_model=Series,
    summary="Hit rate, bytes/s per path, leases held, failures per cause, TTFT over time",
)
def time_series(
    session: SessionDep,
    window_s: WindowS = 900.0,
    step_s: float | None = Query(None, gt=0, le=86400, description="seconds per point"),
):
    bounds = bounds_of(window_s, series.step_for(window_s, step_s))
    incidents, _, _ = incidents_in(session, bounds["since"], bounds["until"])
    return series.build(session, bounds, incidents)


@router.get("/engines", response_model=list[EnginePublic], summary="Engines by service and role")
def list_engines(session: SessionDep, settings: SettingsDep):
    return engines(session.connection(), time.time_ns(), settings.engine_lost_after_s)
