"""Leases: pinning hits against eviction, release paths, expiry, counters."""

from kvscope.connector.cpu_offload.host_pool import HostBlockPool
from kvscope.connector.cpu_offload.leases import LeaseTable


def block_key(n: int) -> bytes:
    return n.to_bytes(8, "big")


def stored_pool(num_blocks: int, num_keys: int) -> HostBlockPool:
    pool = HostBlockPool(num_blocks)
    pool.commit(pool.reserve([block_key(n) for n in range(num_keys)]).host_block_ids)
    return pool


def test_a_hit_takes_a_lease_on_its_prefix():
    leases = LeaseTable(stored_pool(4, 2), timeout_s=5.0)
    lease = leases.lookup("req-1", [block_key(0), block_key(1), block_key(2)], now=100.0)
    assert lease is not None
    assert (lease.req_id, lease.host_block_ids) == ("req-1", (0, 1))
    assert lease.block_keys == (block_key(0), block_key(1))
    assert (lease.created_at, lease.expires_at) == (100.0, 105.0)
    assert leases.lookup("req-2", [block_key(9)]) is None
    assert leases.active() == [lease]


def test_leased_blocks_survive_eviction_attempts_and_pool_pressure():
    pool = stored_pool(2, 2)
    leases = LeaseTable(pool)
    leases.lookup("req-1", [block_key(0), block_key(1)])
    assert pool.evict(block_key(0)) is False
    assert pool.reserve([block_key(5)]).refused == 1
    assert leases.counters().eviction_refused == 1
    assert pool.lookup([block_key(0), block_key(1)]) == [0, 1]


def test_release_is_idempotent_and_makes_blocks_evictable():
    pool = stored_pool(2, 2)
    leases = LeaseTable(pool)
    lease = leases.lookup("req-1", [block_key(0)])
    assert leases.release(lease.lease_id) == lease
    assert leases.release(lease.lease_id) is None
    assert leases.counters().released == 1
    assert pool.evict(block_key(0)) is True


def test_two_leases_on_one_block_both_must_go():
    pool = stored_pool(2, 1)
    leases = LeaseTable(pool)
    first = leases.lookup("req-1", [block_key(0)])
    leases.lookup("req-2", [block_key(0)])
    leases.release(first.lease_id)
    assert pool.evict(block_key(0)) is False
    leases.release_holder("req-2")
    assert pool.evict(block_key(0)) is True


def test_finishing_a_request_releases_all_its_leases():
    pool = stored_pool(4, 4)
    leases = LeaseTable(pool)
    leases.lookup("req-1", [block_key(0), block_key(1)])
    leases.lookup("req-1", [block_key(2)])
    other = leases.lookup("req-2", [block_key(3)])
    released = leases.release_holder("req-1")
    assert [lease.host_block_ids for lease in released] == [(0, 1), (2,)]
    assert leases.active() == [other]
    assert leases.holders() == ["req-2"]
    assert leases.release_holder("req-1") == []


def test_expiry_returns_only_overdue_leases_and_unpins_them():
    pool = stored_pool(4, 2)
    leases = LeaseTable(pool, timeout_s=10.0)
    early = leases.lookup("req-1", [block_key(0)], now=0.0)
    late = leases.lookup("req-2", [block_key(1)], now=5.0)
    assert leases.expire(now=9.9) == []
    assert leases.expire(now=10.0) == [early]
    assert leases.active() == [late]
    assert pool.evict(block_key(0)) is True
    assert leases.release(early.lease_id) is None  # a late release after expiry is harmless
    counters = leases.counters()
    assert (counters.acquired, counters.released, counters.expired, counters.active) == (2, 0, 1, 1)


def test_expiry_uses_the_clock_when_no_time_is_given():
    now = [0.0]
    leases = LeaseTable(stored_pool(2, 1), timeout_s=1.0, clock=lambda: now[0])
    lease = leases.lookup("req-1", [block_key(0)])
    now[0] = 2.0
    assert leases.expire() == [lease]


def test_a_lease_may_get_its_own_timeout_and_expires_alone():
    leases = LeaseTable(stored_pool(4, 2), timeout_s=30.0)
    short = leases.lookup("req-1", [block_key(0)], now=100.0, timeout_s=0.05)
    normal = leases.lookup("req-2", [block_key(1)], now=100.0)
    assert (short.expires_at, normal.expires_at) == (100.05, 130.0)
    assert leases.expire(now=101.0) == [short]
    assert leases.active() == [normal]
