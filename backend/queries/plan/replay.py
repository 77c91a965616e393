"""Replays one engine's recorded pool accesses against a pool of another size and policy."""

from dataclasses import dataclass, field

from kvscope.backend.queries.plan.policies import POLICIES, Policy
from kvscope.backend.queries.plan.stream import EngineStream


@dataclass(frozen=True)
class Outcome:
    """What a replayed pool would have served: hit and asked tokens over every lookup; the
    lookups that stopped at a block still being stored (counted as the misses they are) and the
    hit tokens those stores in flight cost them; each request's hit tokens at its last lookup."""

    policy: str
    pool_blocks: int
    hit_tokens: int
    asked_tokens: int
    evicted_blocks: int
    in_flight_lookups: int = 0
    in_flight_tokens: int = 0
    hits_by_request: dict[str, int] = field(default_factory=dict, compare=False)

    @property
    def pool_hit_rate(self) -> float:
        """Hit tokens over the tokens asked of the host pool (window totals, never a mean of
        ratios): the pool's own figure, not the prompt-token hit rate of traces.hit_rate."""
        return self.hit_tokens / self.asked_tokens if self.asked_tokens else 0.0


def replay(stream: EngineStream, policy_name: str, pool_blocks: int) -> Outcome:
    """The stream's lookups answered by a pool of pool_blocks blocks under the policy.

    A lookup hits the longest committed prefix of its keys (the pool's own rule) and pins
    them until the request's lease ends or it stores. At the first step that schedules it
    after its lookup, a request reserves what it asked beyond its hit; the blocks it stored
    in the recording are reserved at their commit. Reserved blocks are pinned and invisible
    to lookups until the next commit reported, and a store stops at the first block that gets
    no place; a lookup that reaches a block being written stops there, a miss (counted in
    in_flight_lookups, with the tokens it would have hit once the writes ended in
    in_flight_tokens). At a smaller pool a block found today must be stored; at a larger one a
    stored block may already be there. The recorded evictions are the recorded pool's
    (compared with the replay's at today's size); the replay makes its own.
    """
    pool: Policy = POLICIES[policy_name](pool_blocks)
    # By request id (None: an access that names no request, as the stream gave it).
    pending: dict[str | None, tuple[str, ...]] = {}  # keys asked beyond the hit, not stored yet
    pinned: dict[str | None, tuple[str, ...]] = {}
    writing: dict[str, int] = {}  # reserved, being copied: invisible and not evictable
    hit_blocks = asked_blocks = in_flight_lookups = in_flight_blocks = 0
    hits_by_request: dict[str, int] = {}
    for access in stream.accesses:
        if access.kind == "lookup":
            _unpin(pool, pinned, access.req_id)
            hit = _longest_prefix(pool, writing, access.keys)
            hit_blocks += len(hit)
            asked_blocks += len(access.keys)
            once_written = len(_longest_prefix(pool, {}, access.keys)) - len(hit)
            in_flight_lookups += once_written > 0
            in_flight_blocks += once_written
            if access.req_id is not None:
                hits_by_request[access.req_id] = len(hit) * stream.block_size
            for key in hit:
                pool.hit(key)
                pool.pin(key)
            pinned[access.req_id] = hit
            pending[access.req_id] = access.keys[len(hit) :]
        elif access.kind == "step" and access.req_id in pending:
            # Scheduled after its lookup: what it missed is reserved as its prefill fills
            # it, once; blocks that got no place then are never stored (the cursor moved on).
            _reserve(pool, writing, access.time_ns, pending.pop(access.req_id))
        elif access.kind == "store":  # a request stores once its load ended
            _unpin(pool, pinned, access.req_id)
            keys = pending.pop(access.req_id, ()) + access.keys  # no step seen: now
            _reserve(pool, writing, access.time_ns, keys)
            _commit(pool, writing, access.time_ns)
        elif access.kind == "release":
            _unpin(pool, pinned, access.req_id)
    return Outcome(
        policy_name,
        pool_blocks,
        hit_blocks * stream.block_size,
        asked_blocks * stream.block_size,
        pool.evicted,
        in_flight_lookups,
        in_flight_blocks * stream.block_size,
        hits_by_request,
    )


def measured(stream: EngineStream) -> tuple[int, int]:
    """Today's hit tokens as the connector answered its lookups, and the tokens they asked."""
    lookups = [a for a in stream.accesses if a.kind == "lookup"]
    return sum(a.hit_tokens for a in lookups), sum(len(a.keys) for a in lookups) * stream.block_size


def measured_by_request(stream: EngineStream) -> dict[str, int]:
    """Each request's hit tokens at its last lookup, as the connector answered it."""
    return {a.req_id: a.hit_tokens for a in stream.accesses if a.kind == "lookup" and a.req_id}


def recorded_in_flight(stream: EngineStream) -> int:
    """Lookups the pool itself answered with a block still being stored as the first miss."""
    return sum(a.found_writing for a in stream.accesses if a.kind == "lookup")


def distinct_blocks(stream: EngineStream) -> int:
    """Blocks the stream ever asked or stored: a pool this large never evicts."""
    return len({key for access in stream.accesses for key in access.keys})


def recorded_evictions(stream: EngineStream) -> int:
    return sum(len(a.keys) for a in stream.accesses if a.kind == "evict")


def _longest_prefix(pool: Policy, writing: dict, keys: tuple[str, ...]) -> tuple[str, ...]:
    """The committed prefix: a block still being written is a hole."""
    for index, key in enumerate(keys):
        if key not in pool or key in writing:
            return keys[:index]
    return keys


def _reserve(pool: Policy, writing: dict[str, int], now_ns: int, keys: tuple[str, ...]) -> None:
    """Takes blocks for the keys not in the pool, in order, pinned until their commit; stops
    at the first that gets no place, as the pool does (a block after a hole is never hit)."""
    for key in dict.fromkeys(keys):
        if key in pool:
            continue
        if not pool.insert(key):
            return
        pool.pin(key)
        writing[key] = now_ns


def _commit(pool: Policy, writing: dict[str, int], now_ns: int) -> None:
    """A commit reported now: every copy planned until now has ended (the workers report a
    step's copies together)."""
    for key in [key for key, reserved_ns in writing.items() if reserved_ns <= now_ns]:
        del writing[key]
        pool.unpin(key)


def _unpin(pool: Policy, pinned: dict[str | None, tuple[str, ...]], req_id: str | None) -> None:
    for key in pinned.pop(req_id, ()):
        pool.unpin(key)
