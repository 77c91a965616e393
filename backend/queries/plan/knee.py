"""The infinite-pool ceiling of an engine's stream and the smallest pool within 1% of it."""

import math
from dataclasses import dataclass, field

from kvscope.backend.queries.plan.replay import Outcome, distinct_blocks, replay
from kvscope.backend.queries.plan.stream import EngineStream

KNEE_SHARE = 0.99
"""The knee: the smallest pool whose hit tokens reach this share of the ceiling's."""
SIZE_STEPS = 256
"""The search's resolution: the size step is the ceiling's pool over this, at least a block."""


@dataclass
class Replays:
    """One engine's replays by policy and size, each run once however often it is asked."""

    stream: EngineStream
    outcomes: dict[tuple[str, int], Outcome] = field(default_factory=dict)

    def at(self, policy: str, pool_blocks: int) -> Outcome:
        key = (policy, max(1, pool_blocks))
        if key not in self.outcomes:
            self.outcomes[key] = replay(self.stream, *key)
        return self.outcomes[key]


@dataclass(frozen=True)
class Ceiling:
    """What a pool that never evicts would hit: one block for every block the stream ever
    asked or stored. Stores in flight still miss there; every policy hits the same."""

    pool_blocks: int
    size_step_blocks: int
    outcome: Outcome

    @property
    def target_tokens(self) -> int:
        return math.ceil(KNEE_SHARE * self.outcome.hit_tokens)


def ceiling(replays: Replays) -> Ceiling:
    pool_blocks = max(1, distinct_blocks(replays.stream))
    step = max(1, math.ceil(pool_blocks / SIZE_STEPS))
    return Ceiling(pool_blocks, step, replays.at("lru", pool_blocks))


def knee(replays: Replays, policy: str, top: Ceiling) -> Outcome:
    """The smallest pool, to within top.size_step_blocks, whose hit tokens reach the target.

    Halves the ceiling's pool until a size misses the target, then bisects between that size
    and the last that met it until they are one step apart; the size returned meets it and one
    step below it does not. At most log2(ceiling) + 8 replays: the bisection's bracket is at
    most half the ceiling's pool and the step a 256th of it. It takes a larger pool never to
    hit less, which holds for LRU without pins (its stack property) and nearly for the others:
    a size between the grid's points may hit a little more than the answer.
    """
    target = top.target_tokens
    high = top.pool_blocks
    while high > 1 and replays.at(policy, high // 2).hit_tokens >= target:
        high //= 2
    low = high // 2
    while high - low > top.size_step_blocks:
        middle = (low + high) // 2
        if replays.at(policy, middle).hit_tokens >= target:
            high = middle
        else:
            low = middle
    return replays.at(policy, high)
