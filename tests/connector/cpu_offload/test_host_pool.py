"""Host block pool: visibility after commit, prefix lookups, LRU eviction, refusals, namespaces."""

import pytest

from kvscope.connector.cpu_offload.host_pool import (
    BlockState,
    HostBlockPool,
    KVNamespace,
    num_host_blocks,
)


def block_key(n: int) -> bytes:
    return n.to_bytes(8, "big")


def store(pool: HostBlockPool, keys: list[bytes]) -> list[int]:
    reservation = pool.reserve(keys)
    pool.commit(reservation.host_block_ids)
    return reservation.host_block_ids


def test_reserved_blocks_are_invisible_until_committed():
    pool = HostBlockPool(4)
    keys = [block_key(n) for n in range(3)]
    reservation = pool.reserve(keys)
    assert reservation.host_block_ids == [0, 1, 2]  # a fresh pool hands out one contiguous run
    assert pool.lookup(keys) == []
    pool.commit(reservation.host_block_ids)
    assert pool.lookup(keys) == [0, 1, 2]


def test_lookup_stops_at_the_first_hole():
    pool = HostBlockPool(8)
    store(pool, [block_key(0), block_key(1), block_key(3)])
    assert pool.lookup([block_key(n) for n in range(4)]) == [0, 1]
    assert pool.lookup([block_key(2), block_key(3)]) == []


def test_abort_returns_blocks_and_keys_stay_absent():
    pool = HostBlockPool(2)
    reservation = pool.reserve([block_key(0), block_key(1)])
    pool.abort(reservation.host_block_ids)
    assert pool.lookup([block_key(0)]) == []
    assert pool.stats().free == 2
    assert store(pool, [block_key(5), block_key(6)]) == [0, 1]


def test_keys_already_present_are_not_stored_twice():
    pool = HostBlockPool(4)
    store(pool, [block_key(0)])
    reservation = pool.reserve([block_key(0), block_key(1)])
    assert reservation.already_present == [block_key(0)]
    assert reservation.block_keys == [block_key(1)]


def test_pool_too_small_evicts_least_recently_used():
    pool = HostBlockPool(4)
    first, second = [block_key(0), block_key(1)], [block_key(2), block_key(3)]
    store(pool, first)
    store(pool, second)
    pool.lookup(first)  # touching the first pair makes the second pair the LRU one
    reservation = pool.reserve([block_key(4), block_key(5)])
    assert reservation.evicted_keys == second
    pool.commit(reservation.host_block_ids)
    assert pool.lookup(first) == [0, 1]
    assert pool.lookup(second) == []
    assert pool.stats().evicted_blocks == 2


def test_reserved_blocks_are_never_evicted_for_another_store():
    pool = HostBlockPool(2)
    pool.reserve([block_key(0), block_key(1)])
    reservation = pool.reserve([block_key(2)])
    assert reservation.host_block_ids == [] and reservation.refused == 1
    assert pool.evict(block_key(0)) is False
    assert pool.stats().eviction_refused == 1


def test_full_pool_of_pinned_blocks_refuses_stores_without_corrupting_the_index():
    pool = HostBlockPool(2)
    held = store(pool, [block_key(0), block_key(1)])
    pool.pin(held)
    reservation = pool.reserve([block_key(7), block_key(8), block_key(9)])
    assert reservation.host_block_ids == [] and reservation.refused == 3
    assert pool.stats().store_refused_blocks == 3
    assert pool.lookup([block_key(0), block_key(1)]) == held


def test_a_partial_reservation_is_a_prefix():
    pool = HostBlockPool(3)
    pool.pin(store(pool, [block_key(0)]))
    reservation = pool.reserve([block_key(n) for n in range(10, 15)])
    assert reservation.block_keys == [block_key(10), block_key(11)]
    assert reservation.refused == 3


def test_unpinned_blocks_become_evictable_again():
    pool = HostBlockPool(1)
    held = store(pool, [block_key(0)])
    pool.pin(held)
    assert pool.evict(block_key(0)) is False
    pool.unpin(held)
    assert pool.evict(block_key(0)) is True
    assert pool.state_of(block_key(0)) is BlockState.FREE
    with pytest.raises(ValueError, match="not pinned"):
        pool.unpin(held)


def test_a_cache_reset_evicts_committed_blocks_but_not_pinned_or_reserved_ones():
    pool = HostBlockPool(8)
    store(pool, [block_key(0), block_key(1), block_key(2)])
    pool.pin([1])  # a lease's load still reads it
    reserving = pool.reserve([block_key(5)])  # a store still copies into it
    assert pool.evict_committed() == [block_key(0), block_key(2)]
    assert pool.state_of(block_key(1)) is BlockState.COMMITTED
    assert pool.state_of(block_key(5)) is BlockState.RESERVED
    assert reserving.host_block_ids and pool.lookup([block_key(0)]) == []


def test_commit_of_a_block_that_is_not_reserved_is_an_error():
    pool = HostBlockPool(2)
    host_block_ids = store(pool, [block_key(0)])
    with pytest.raises(ValueError, match="committed, expected reserved"):
        pool.commit(host_block_ids)


def test_capacity_counts_whole_blocks_across_layers():
    assert num_host_blocks(cpu_bytes_to_use=10 * 4096 + 100, bytes_per_block=4096) == 10
    assert num_host_blocks(cpu_bytes_to_use=100, bytes_per_block=4096) == 0


def namespace(**changes) -> KVNamespace:
    base = dict(
        model="tiny-llama",
        dtype="bfloat16",
        kv_layout="cpu",
        block_size=32,
        tp_rank=0,
        tp_size=1,
        num_layers=2,
        num_kv_heads=2,
        head_dim=32,
    )
    return KVNamespace(**(base | changes))


def test_kv_from_an_incompatible_engine_never_hits():
    pool = HostBlockPool(4)
    block_hashes = [b"hash-a", b"hash-b"]
    store(pool, namespace().block_keys(block_hashes))
    assert pool.lookup(namespace().block_keys(block_hashes)) == [0, 1]
    for change in [{"dtype": "float16"}, {"tp_rank": 1}, {"block_size": 64}, {"model": "other"}]:
        assert pool.lookup(namespace(**change).block_keys(block_hashes)) == []


def test_block_key_requires_bytes():
    with pytest.raises(TypeError, match="bytes"):
        namespace().block_key(12345)  # type: ignore[arg-type]
