"""The sizing report of a window: every engine's replay at each candidate size and policy."""

from pydantic import BaseModel, Field
from sqlalchemy.engine import Connection

from kvscope.backend.queries.plan.policies import POLICIES
from kvscope.backend.queries.plan.price import measured_rates
from kvscope.backend.queries.plan.replay import measured, recorded_evictions, replay
from kvscope.backend.queries.plan.stream import read_streams

FACTORS: tuple[float, ...] = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0)
"""Candidate pool sizes as multiples of today's."""


class SizingRow(BaseModel):
    policy: str
    factor: float
    pool_blocks: int
    hit_tokens: int
    pool_hit_rate: float = Field(description="hit tokens over the tokens asked of the host pool")
    prefill_tokens_saved: int
    seconds_saved: float | None
    evicted_blocks: int


class EngineSizing(BaseModel):
    engine_id: str
    block_size: int
    pool_blocks: int
    lookups: int
    asked_tokens: int
    measured_hit_tokens: int
    recorded_evicted_blocks: int
    load_tokens_per_s: float | None
    prefill_tokens_per_s: float | None
    rows: list[SizingRow]


class SizingPublic(BaseModel):
    window_s: float
    factors: list[float]
    engines: list[EngineSizing]
    not_replayable: list[str]  # engines with pool events but no lookup said what it asked


def sizing(
    connection: Connection,
    since_ns: int,
    until_ns: int,
    window_s: float,
    factors: tuple[float, ...] = FACTORS,
) -> SizingPublic:
    engines, not_replayable = [], []
    for engine_id, stream in sorted(read_streams(connection, since_ns, until_ns).items()):
        if not stream.replayable:
            if any(a.kind in ("store", "evict") for a in stream.accesses):
                not_replayable.append(engine_id)
            continue
        rates = measured_rates(connection, engine_id, stream.block_size, since_ns, until_ns)
        hit_tokens, asked_tokens = measured(stream)
        rows = []
        for policy in POLICIES:
            for factor in factors:
                outcome = replay(stream, policy, max(1, round(stream.pool_blocks * factor)))
                rows.append(
                    SizingRow(
                        policy=policy,
                        factor=factor,
                        pool_blocks=outcome.pool_blocks,
                        hit_tokens=outcome.hit_tokens,
                        pool_hit_rate=outcome.pool_hit_rate,
                        prefill_tokens_saved=outcome.hit_tokens,
                        seconds_saved=rates.seconds_saved(outcome.hit_tokens),
                        evicted_blocks=outcome.evicted_blocks,
                    )
                )
        engines.append(
            EngineSizing(
                engine_id=engine_id,
                block_size=stream.block_size,
                pool_blocks=stream.pool_blocks,
                lookups=sum(a.kind == "lookup" for a in stream.accesses),
                asked_tokens=asked_tokens,
                measured_hit_tokens=hit_tokens,
                recorded_evicted_blocks=recorded_evictions(stream),
                load_tokens_per_s=rates.load_tokens_per_s,
                prefill_tokens_per_s=rates.prefill_tokens_per_s,
                rows=rows,
            )
        )
    return SizingPublic(
        window_s=window_s, factors=list(factors), engines=engines, not_replayable=not_replayable
    )
