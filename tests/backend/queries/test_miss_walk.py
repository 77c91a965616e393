"""The miss walk's rules on accesses written out by hand, for the reasons a served workload
cannot plant on demand (a store still copying at lookup, a bypassed tier) and for the walk's
own bounds; tests/integration/test_misses_real.py plants the others on a real engine."""

from kvscope.backend.queries.accounting import RequestAccount
from kvscope.backend.queries.misses.explain import explain
from kvscope.backend.queries.misses.history import Access
from kvscope.backend.queries.misses.walk import EngineWalk

S = 10**9
BLOCK = 16


def lookup(t: int, req: str, keys: str, hit: int, state: str | None = None, start: int = 0):
    return Access(
        "e",
        t * S,
        "lookup",
        req,
        tuple(keys),
        tuple(f"c{k}" for k in keys),
        hit,
        BLOCK,
        start,
        state,
    )


def account(req: str, prompt: int, local: int = 0, host: int = 0, at: int = 0) -> RequestAccount:
    return RequestAccount(
        id=1,
        request_id=req,
        engine_id="e",
        end_ns=(at + 1) * S,
        prompt_tokens=prompt,
        local_hit_tokens=local,
        external_hit_tokens={"host": host} if host else {},
        computed_tokens=prompt - local - host,
        vllm_local_cached=None,
        vllm_external_cached=None,
        violation=None,
        lookup_ns=at * S,
    )


def reasons(found) -> list[tuple[str, int]]:
    return [(r.reason, r.tokens) for r in found.reasons]


def test_a_block_still_being_written_at_lookup_is_a_store_in_flight():
    walk = EngineWalk()
    walk.feed(Access("e", 1 * S, "store", "a", ("x",)))
    walk.feed(lookup(2, "b", "xy", hit=1, state="writing"))  # y reserved by a's store
    found = explain(account("b", 2 * BLOCK + 1, host=BLOCK, at=2), walk, failed=False)
    assert reasons(found) == [("partial_block", 1), ("store_in_flight", BLOCK)]
    assert found.violation is None and found.served_tokens == BLOCK


def test_a_block_the_pool_holds_behind_a_miss_missed_for_that_miss():
    walk = EngineWalk()
    walk.feed(Access("e", 1 * S, "store", "a", ("x", "y", "z")))
    walk.feed(Access("e", 2 * S, "evict", None, ("y",)))
    walk.feed(lookup(3, "b", "xyz", hit=1))
    found = explain(account("b", 4 * BLOCK + 1, host=BLOCK, at=3), walk, failed=False)
    evicted = [r for r in found.reasons if r.reason == "evicted"]
    assert len(evicted) == 1 and evicted[0].blocks == 2  # y evicted, z behind it
    assert evicted[0].evicted_before_lookup_s == 1.0


def test_a_bypassed_tier_explains_the_whole_blocks_it_was_not_asked_for():
    walk = EngineWalk()
    walk.feed(lookup(1, "a", "x", hit=0))  # an earlier lookup told the block size
    walk.feed(Access("e", 5 * S, "skipped", "b"))
    found = explain(account("b", 4 * BLOCK + 3, local=BLOCK, at=5), walk, failed=False)
    assert reasons(found) == [
        ("local_prefix_cache", BLOCK),
        ("partial_block", 3),
        ("tier_bypassed", 3 * BLOCK),
    ]


def test_hits_the_lookup_cannot_explain_are_a_violation():
    walk = EngineWalk()
    walk.feed(lookup(1, "b", "xy", hit=0))
    found = explain(account("b", 5 * BLOCK + 1, at=1), walk, failed=False)  # 4 blocks past
    assert found.violation is not None and "explains 32 missed tokens" in found.violation


def test_a_walk_fed_for_long_forgets_what_only_old_lookups_could_use():
    walk = EngineWalk()
    for t in range(100):
        key = f"k{t}"
        walk.feed(lookup(t, f"r{t}", (key,), hit=0))
        walk.feed(Access("e", t * S, "store", f"r{t}", (key,)))
        walk.feed(Access("e", t * S, "evict", None, (key,)))
    walk.forget(90 * S)
    assert len(walk.lookups) == 10
    assert len(walk._evicted) == 10 and len(walk._content_of) == 10
