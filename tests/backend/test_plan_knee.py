"""The plan's ceiling, knee, stores in flight and predicted TTFT on small synthetic streams."""

import pytest

from kvscope.backend.queries.plan.knee import Replays, ceiling, knee
from kvscope.backend.queries.plan.price import Rates
from kvscope.backend.queries.plan.replay import recorded_in_flight, replay
from kvscope.backend.queries.plan.stream import Access, EngineStream
from kvscope.backend.queries.plan.ttft import MeasuredTtft, predicted_ttft

BLOCK = 32


def _cyclic(families: int, blocks: int, passes: int) -> EngineStream:
    """Families of `blocks` blocks asked one request at a time, every family once a pass: the
    first pass stores them, each later one finds them all in a pool of families x blocks."""
    accesses, now = [], 0
    for number in range(passes):
        for family in range(families):
            keys = tuple(f"f{family}b{block}" for block in range(blocks))
            req_id, hit = f"p{number}f{family}", 0 if number == 0 else blocks * BLOCK
            for kind, stored in (("lookup", ()), ("step", ()), ("store", keys), ("release", ())):
                now += 1
                accesses.append(Access(now, kind, req_id, stored or keys, hit))
    return EngineStream("engine", BLOCK, pool_blocks=8, accesses=accesses)


def test_the_ceiling_hits_every_repeat_and_the_lru_knee_is_the_working_set():
    stream = _cyclic(families=5, blocks=6, passes=4)
    replays = Replays(stream)
    top = ceiling(replays)
    assert top.pool_blocks == 30 and top.size_step_blocks == 1
    assert top.outcome.hit_tokens == 3 * 5 * 6 * BLOCK and top.outcome.evicted_blocks == 0
    # A cyclic order under LRU: one block short of the working set and every lookup misses.
    assert knee(replays, "lru", top).pool_blocks == 30
    assert replays.at("lru", 29).hit_tokens == 0
    for policy in ("2q", "s3fifo"):
        found = knee(replays, policy, top)
        assert found.hit_tokens >= 0.99 * top.outcome.hit_tokens
        assert replays.at(policy, found.pool_blocks - 1).hit_tokens < found.hit_tokens
    assert len(replays.outcomes) <= 3 * 2 * 5 + 1  # about 2 log2(30) replays a policy


def test_a_large_pool_is_searched_to_a_step_of_a_256th():
    stream = _cyclic(families=100, blocks=6, passes=2)
    replays = Replays(stream)
    top = ceiling(replays)
    assert top.size_step_blocks == 3  # 600 blocks / 256, rounded up
    assert abs(knee(replays, "lru", top).pool_blocks - 600) <= top.size_step_blocks


def test_a_lookup_that_finds_a_block_still_being_stored_misses_and_is_counted():
    stream = EngineStream(
        "engine",
        BLOCK,
        pool_blocks=4,
        accesses=[
            Access(1, "lookup", "r1", ("a", "b")),
            Access(2, "step", "r1"),  # a and b reserved: being written
            Access(3, "lookup", "r2", ("a", "b"), found_writing=True),  # before r1's commit
            Access(4, "store", "r1", ("a", "b")),
            Access(5, "store", "r2", ("a", "b")),
            Access(6, "lookup", "r3", ("a", "b")),
        ],
    )
    outcome = replay(stream, "lru", 4)
    assert outcome.hit_tokens == 2 * BLOCK  # r3 alone
    assert (outcome.in_flight_lookups, outcome.in_flight_tokens) == (1, 2 * BLOCK)
    assert recorded_in_flight(stream) == 1  # the pool said so too (its first miss: 'writing')
    assert outcome.hits_by_request == {"r1": 0, "r2": 0, "r3": 2 * BLOCK}


def test_predicted_ttft_moves_each_request_by_its_extra_hits_at_measured_rates():
    today = MeasuredTtft(ttft_ms={"r1": 100.0, "r2": 50.0}, hit_tokens={"r1": 0, "r2": 64})
    rates = Rates(load_tokens_per_s=64_000.0, prefill_tokens_per_s=1_000.0)
    # r1 gains 64 hit tokens: 64 ms of prefill spared, 1 ms of load paid; r2 is unchanged.
    p50, p95 = predicted_ttft(today, {"r1": 64, "r2": 64}, rates)
    assert p50 == pytest.approx((37.0 + 50.0) / 2)
    assert p95 == pytest.approx(37.0 + 0.95 * 13.0)
    # Losing hits costs the same time back; no rates, no prediction.
    assert predicted_ttft(today, {"r1": 0, "r2": 0}, rates)[1] == pytest.approx(113.0 - 0.05 * 13)
    assert predicted_ttft(today, {}, Rates(None, 1_000.0)) == (None, None)
