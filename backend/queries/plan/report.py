"""The sizing report of a window: every engine's replay at each candidate size and policy, its
infinite-pool ceiling and each policy's knee, with predicted TTFTs."""

from sqlalchemy.engine import Connection

from kvscope.backend.queries.plan import schemas
from kvscope.backend.queries.plan.knee import KNEE_SHARE, Replays, ceiling, knee
from kvscope.backend.queries.plan.policies import POLICIES
from kvscope.backend.queries.plan.price import Rates, measured_rates
from kvscope.backend.queries.plan.replay import (
    Outcome,
    measured,
    measured_by_request,
    recorded_evictions,
    recorded_in_flight,
)
from kvscope.backend.queries.plan.stream import EngineStream, read_streams
from kvscope.backend.queries.plan.ttft import MeasuredTtft, measured_ttft, predicted_ttft

FACTORS: tuple[float, ...] = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0)
"""Candidate pool sizes as multiples of today's."""


def sizing(
    connection: Connection,
    since_ns: int,
    until_ns: int,
    window_s: float,
    factors: tuple[float, ...] = FACTORS,
) -> schemas.SizingPublic:
    engines, not_replayable = [], []
    for engine_id, stream in sorted(read_streams(connection, since_ns, until_ns).items()):
        if not stream.replayable:
            if any(a.kind in ("store", "evict") for a in stream.accesses):
                not_replayable.append(engine_id)
            continue
        engines.append(_engine(connection, stream, since_ns, until_ns, factors))
    return schemas.SizingPublic(
        window_s=window_s,
        factors=list(factors),
        knee_share=KNEE_SHARE,
        engines=engines,
        not_replayable=not_replayable,
    )


def _engine(
    connection: Connection,
    stream: EngineStream,
    since_ns: int,
    until_ns: int,
    factors: tuple[float, ...],
) -> schemas.EngineSizing:
    rates = measured_rates(connection, stream.engine_id, stream.block_size, since_ns, until_ns)
    hit_tokens, asked_tokens = measured(stream)
    today = measured_ttft(connection, measured_by_request(stream), since_ns, until_ns)
    replays = Replays(stream)
    top = ceiling(replays)
    rows = [
        _row(replays.at(policy, round(stream.pool_blocks * factor)), factor, rates, today)
        for policy in POLICIES
        for factor in factors
    ]
    knees = [_knee(knee(replays, policy, top), stream, rates, today) for policy in POLICIES]
    ttft_p50, ttft_p95 = today.p50_p95
    return schemas.EngineSizing(
        engine_id=stream.engine_id,
        block_size=stream.block_size,
        pool_blocks=stream.pool_blocks,
        lookups=sum(a.kind == "lookup" for a in stream.accesses),
        asked_tokens=asked_tokens,
        measured_hit_tokens=hit_tokens,
        recorded_evicted_blocks=recorded_evictions(stream),
        recorded_in_flight_lookups=recorded_in_flight(stream),
        load_tokens_per_s=rates.load_tokens_per_s,
        prefill_tokens_per_s=rates.prefill_tokens_per_s,
        priced_requests=len(today.ttft_ms),
        measured_ttft_ms_p50=ttft_p50,
        measured_ttft_ms_p95=ttft_p95,
        size_step_blocks=top.size_step_blocks,
        ceiling=schemas.Ceiling(
            pool_blocks=top.pool_blocks,
            **_served(top.outcome, rates, today),
            in_flight_lookups=top.outcome.in_flight_lookups,
            in_flight_tokens=top.outcome.in_flight_tokens,
        ),
        knees=knees,
        rows=rows,
    )


def _served(outcome: Outcome, rates: Rates, today: MeasuredTtft) -> dict:
    p50, p95 = predicted_ttft(today, outcome.hits_by_request, rates)
    return {
        "hit_tokens": outcome.hit_tokens,
        "pool_hit_rate": outcome.pool_hit_rate,
        "predicted_ttft_ms_p50": p50,
        "predicted_ttft_ms_p95": p95,
    }


def _row(outcome: Outcome, factor: float, rates: Rates, today: MeasuredTtft) -> schemas.SizingRow:
    return schemas.SizingRow(
        policy=outcome.policy,
        factor=factor,
        pool_blocks=outcome.pool_blocks,
        **_served(outcome, rates, today),
        prefill_tokens_saved=outcome.hit_tokens,
        seconds_saved=rates.seconds_saved(outcome.hit_tokens),
        evicted_blocks=outcome.evicted_blocks,
        in_flight_lookups=outcome.in_flight_lookups,
        in_flight_tokens=outcome.in_flight_tokens,
    )


def _knee(
    outcome: Outcome, stream: EngineStream, rates: Rates, today: MeasuredTtft
) -> schemas.Knee:
    return schemas.Knee(
        policy=outcome.policy,
        pool_blocks=outcome.pool_blocks,
        factor=outcome.pool_blocks / stream.pool_blocks if stream.pool_blocks else 0.0,
        **_served(outcome, rates, today),
    )
