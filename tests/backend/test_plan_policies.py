"""The replayed pool's policies and replay on small synthetic streams."""

from kvscope.backend.queries.plan.policies import PoolLRU, TwoQ
from kvscope.backend.queries.plan.replay import replay
from kvscope.backend.queries.plan.s3fifo import S3FIFO
from kvscope.backend.queries.plan.stream import Access, EngineStream


def test_pool_lru_evicts_the_least_recently_used_and_never_a_pinned_block():
    pool = PoolLRU(2)
    assert pool.insert("a") and pool.insert("b")
    pool.hit("a")  # b is now the oldest use
    assert pool.insert("c")
    assert "b" not in pool and "a" in pool and "c" in pool
    pool.pin("a")
    pool.pin("c")
    assert not pool.insert("d")  # both leased: the pool refuses, as the host pool does
    pool.unpin("a")
    assert pool.insert("d") and "a" not in pool and "c" in pool
    assert pool.evicted == 2


def test_2q_keeps_blocks_used_twice_through_a_scan():
    lru, two_q = PoolLRU(8), TwoQ(8)
    for pool in (lru, two_q):
        for key in ("h1", "h2", "h3"):  # stored, evicted from the FIFO, stored again: hot
            pool.insert(key)
        for scan in range(8):
            pool.insert(f"s{scan}")
        for key in ("h1", "h2", "h3"):
            pool.insert(key)
        for scan in range(8, 30):  # a long scan of blocks used once
            pool.insert(f"s{scan}")
    assert all(key in two_q for key in ("h1", "h2", "h3"))
    assert not any(key in lru for key in ("h1", "h2", "h3"))


def test_s3fifo_keeps_blocks_used_twice_through_a_scan_of_blocks_used_once():
    """The paper's claim: one-hit wonders leave from the small FIFO; a block hit once since it
    came in moves to the main FIFO, where a scan never reaches it."""
    lru, s3fifo = PoolLRU(20), S3FIFO(20)
    for pool in (lru, s3fifo):
        for key in ("h1", "h2", "h3"):
            pool.insert(key)
            pool.hit(key)  # a lookup found it: used twice
        for scan in range(60):
            pool.insert(f"s{scan}")
    assert all(key in s3fifo for key in ("h1", "h2", "h3"))
    assert not any(key in lru for key in ("h1", "h2", "h3"))
    # The scan's own blocks are gone quickly: of 60 only the pool's room minus the hot ones.
    assert sum(f"s{scan}" in s3fifo for scan in range(60)) == 17
    # A scanned block stored again soon after it left (its key still a ghost) goes to the main
    # FIFO: the next scan leaves it too.
    assert "s42" not in s3fifo and s3fifo.insert("s42")
    for scan in range(60, 90):
        s3fifo.insert(f"s{scan}")
    assert all(key in s3fifo for key in ("h1", "h2", "h3", "s42"))


def test_s3fifo_never_evicts_a_pinned_block_and_refuses_when_all_are():
    pool = S3FIFO(2)
    assert pool.insert("a") and pool.insert("b")
    pool.pin("a")
    assert pool.insert("c")  # a, the oldest, is leased: b goes instead
    assert "a" in pool and "b" not in pool and "c" in pool
    pool.pin("c")
    assert not pool.insert("d")
    pool.unpin("a")
    assert pool.insert("d") and "a" not in pool and pool.evicted == 2


def _stream(accesses: list[Access], pool_blocks: int = 2) -> EngineStream:
    return EngineStream("engine", block_size=32, pool_blocks=pool_blocks, accesses=accesses)


def test_replay_hits_the_longest_stored_prefix_and_stores_what_it_missed():
    stream = _stream(
        [
            Access(1, "lookup", "r1", ("a", "b")),
            Access(2, "store", "r1", ("a", "b")),
            Access(3, "lookup", "r2", ("a", "b", "c"), hit_tokens=64),
            Access(4, "store", "r2", ("c",)),
            Access(5, "lookup", "r3", ("a", "b"), hit_tokens=64),
        ],
        pool_blocks=3,
    )
    today = replay(stream, "lru", 3)
    assert (today.hit_tokens, today.asked_tokens) == (128, 7 * 32)
    # Two blocks: r2's c evicts a (the oldest use), and r3's lookup stops at the hole.
    small = replay(stream, "lru", 2)
    assert small.hit_tokens == 64 and small.evicted_blocks == 1
    # One block: r1's a is still being written when b asks for a place, so b is refused (a
    # store never evicts its own blocks); r2 finds a, then stores b over it.
    tiny = replay(stream, "lru", 1)
    assert tiny.hit_tokens == 32 and tiny.evicted_blocks == 1
    assert tiny.pool_hit_rate == 32 / (7 * 32)


def test_a_leased_block_survives_the_stores_made_while_its_load_runs():
    stream = _stream(
        [
            Access(1, "store", "r1", ("a",)),
            Access(2, "lookup", "r2", ("a",)),
            Access(3, "store", "r3", ("x",)),  # pool of 1: a is pinned, x is refused
            Access(4, "release", "r2"),
            Access(5, "lookup", "r4", ("a",)),
        ],
        pool_blocks=1,
    )
    outcome = replay(stream, "lru", 1)
    assert outcome.hit_tokens == 64 and outcome.evicted_blocks == 0


def test_blocks_refused_at_their_step_are_not_stored_later():
    """Two requests scheduled in one step into a pool of 2: the first takes both blocks while
    they are written, the second's are refused then and never stored (vLLM's store cursor
    moved on), so a third request asking the second's blocks misses."""
    stream = _stream(
        [
            Access(1, "lookup", "r1", ("a", "b")),
            Access(2, "lookup", "r2", ("x", "y")),
            Access(3, "step", "r1"),
            Access(3, "step", "r2"),
            Access(4, "store", "r1", ("a", "b")),
            Access(5, "lookup", "r3", ("x", "y")),
            Access(6, "lookup", "r4", ("a", "b")),
        ]
    )
    outcome = replay(stream, "lru", 2)
    assert outcome.hit_tokens == 64 and outcome.evicted_blocks == 0
    assert replay(stream, "lru", 4).hit_tokens == 128  # room for both: r3 finds x and y
