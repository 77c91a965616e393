"""Replays one engine's recorded pool accesses against a pool of another size and policy."""

from dataclasses import dataclass

from kvscope.backend.queries.plan.policies import POLICIES, Policy
from kvscope.backend.queries.plan.stream import EngineStream


@dataclass(frozen=True)
class Outcome:
    """What a replayed pool would have served: hit and asked tokens over every lookup."""

    policy: str
    pool_blocks: int
    hit_tokens: int
    asked_tokens: int
    evicted_blocks: int

    @property
    def hit_rate(self) -> float:
        """Hit tokens over asked tokens (window totals, never a mean of ratios)."""
        return self.hit_tokens / self.asked_tokens if self.asked_tokens else 0.0


def replay(stream: EngineStream, policy_name: str, pool_blocks: int) -> Outcome:
    """The stream's lookups answered by a pool of pool_blocks blocks under the policy.

    A lookup hits the longest prefix of its keys in the pool (the pool's own rule) and pins
    them until the request's lease ends. A request stores what it asked beyond its hit at its
    first recorded store (or lease end), and every block it stored in the recording: at a
    smaller pool a block it found today must be stored, at a larger one a stored block may
    already be there. Recorded evictions are the recorded pool's; the replay makes its own.
    """
    pool: Policy = POLICIES[policy_name](pool_blocks)
    pending: dict[str, tuple[str, ...]] = {}  # keys asked beyond the hit, not stored yet
    pinned: dict[str, tuple[str, ...]] = {}
    hit_blocks = asked_blocks = 0
    for access in stream.accesses:
        if access.kind == "lookup":
            _unpin(pool, pinned, access.req_id)
            hit = _longest_prefix(pool, access.keys)
            hit_blocks += len(hit)
            asked_blocks += len(access.keys)
            for key in hit:
                pool.hit(key)
                pool.pin(key)
            pinned[access.req_id] = hit
            pending[access.req_id] = access.keys[len(hit) :]
        elif access.kind == "store":  # a request stores once its load ended
            _unpin(pool, pinned, access.req_id)
            _store(pool, pending.pop(access.req_id, ()) + access.keys)
        elif access.kind == "release":
            _unpin(pool, pinned, access.req_id)
            _store(pool, pending.pop(access.req_id, ()))
    return Outcome(
        policy_name,
        pool_blocks,
        hit_blocks * stream.block_size,
        asked_blocks * stream.block_size,
        pool.evicted,
    )


def measured(stream: EngineStream) -> tuple[int, int]:
    """Today's hit tokens as the connector answered its lookups, and the tokens they asked."""
    lookups = [a for a in stream.accesses if a.kind == "lookup"]
    return sum(a.hit_tokens for a in lookups), sum(len(a.keys) for a in lookups) * stream.block_size


def recorded_evictions(stream: EngineStream) -> int:
    return sum(len(a.keys) for a in stream.accesses if a.kind == "evict")


def _longest_prefix(pool: Policy, keys: tuple[str, ...]) -> tuple[str, ...]:
    for index, key in enumerate(keys):
        if key not in pool:
            return keys[:index]
    return keys


def _store(pool: Policy, keys: tuple[str, ...]) -> None:
    """Stores in order and stops at the first block that gets no place, as the pool does (a
    block after a hole could never be hit)."""
    for key in dict.fromkeys(keys):
        if not pool.insert(key):
            return


def _unpin(pool: Policy, pinned: dict[str, tuple[str, ...]], req_id: str | None) -> None:
    for key in pinned.pop(req_id, ()):
        pool.unpin(key)
