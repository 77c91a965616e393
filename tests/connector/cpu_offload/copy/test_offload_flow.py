"""Pool, leases, copy engine and faults together, in the order a connector would drive them."""

import torch

from kvscope.connector.cpu_offload.copy.engine import CopyEngine
from kvscope.connector.cpu_offload.copy.factory import make_copy_engine
from kvscope.connector.cpu_offload.faults import FaultInjector, FaultPlan
from kvscope.connector.cpu_offload.host_pool import HostBlockPool, KVNamespace
from kvscope.connector.cpu_offload.leases import LeaseTable

NAMESPACE = KVNamespace("tiny", "bfloat16", "flash", 32, 0, 1, 3, 2, 16)


def offload(pool: HostBlockPool, engine: CopyEngine, device_block_ids: list[int], keys):
    reservation = pool.reserve(keys)
    device_ids = [device_block_ids[keys.index(k)] for k in reservation.block_keys]
    engine.submit_store(device_ids, reservation.host_block_ids)
    [result] = engine.drain(timeout_s=10)
    assert result.ok
    pool.commit(reservation.host_block_ids)
    return reservation


def test_a_leased_hit_loads_correct_bytes_despite_eviction_attempts_and_pressure(
    make_kv_cache, make_host_buffer
):
    source, target = make_kv_cache("flash", seed=1), make_kv_cache("flash", seed=2)
    host_buffer = make_host_buffer(source, num_host_blocks=4)
    pool = HostBlockPool(host_buffer.num_blocks)
    leases = LeaseTable(pool)
    keys = NAMESPACE.block_keys([b"prefix-0", b"prefix-1", b"prefix-2", b"prefix-3"])
    expected = [source.block_bits(d) for d in (5, 6, 7, 8)]
    with make_copy_engine(source.layers, host_buffer, source.block_dim) as store_engine:
        offload(pool, store_engine, [5, 6, 7, 8], keys)
        lease = leases.lookup("req-hit", keys)
        assert lease is not None and len(lease.host_block_ids) == 4
        # Attacks: a direct eviction and a store that needs the whole (full) pool.
        assert not any(pool.evict(key) for key in keys)
        other_keys = NAMESPACE.block_keys([b"other-0", b"other-1"])
        assert pool.reserve(other_keys).refused == 2
    assert leases.counters().eviction_refused == 4
    with make_copy_engine(target.layers, host_buffer, target.block_dim) as load_engine:
        load_engine.submit_load([0, 1, 2, 3], list(lease.host_block_ids))
        [result] = load_engine.drain(timeout_s=10)
    leases.release(lease.lease_id)
    assert result.ok
    for device_block_id, bits in enumerate(expected):
        assert torch.equal(target.block_bits(device_block_id), bits)


def test_injected_load_failure_travels_like_a_real_one_and_the_lease_is_released(
    make_kv_cache, make_host_buffer
):
    kv = make_kv_cache("cpu_layer_major")
    host_buffer = make_host_buffer(kv, num_host_blocks=4)
    pool = HostBlockPool(host_buffer.num_blocks)
    leases = LeaseTable(pool)
    injector = FaultInjector(FaultPlan(fail_load_req_prefix="doomed-", load_delay_ms=20))
    keys = NAMESPACE.block_keys([b"a", b"b"])
    with make_copy_engine(kv.layers, host_buffer, kv.block_dim) as engine:
        offload(pool, engine, [0, 1], keys)
        lease = leases.lookup("doomed-1", keys)
        fault = injector.on_load(lease.req_id)
        job_id = engine.submit_load(
            [2, 3], list(lease.host_block_ids), fault.delay_s, fault.fail_reason
        )
        [result] = engine.drain(timeout_s=10)
    assert result.job_id == job_id and not result.ok and "doomed-" in result.error
    assert result.finished_at - result.submitted_at >= 0.02
    leases.release_holder("doomed-1")
    assert pool.stats().pinned == 0


def test_an_expired_lease_lets_the_blocks_go_and_a_new_store_reuses_them(
    make_kv_cache, make_host_buffer
):
    kv = make_kv_cache("cpu_block_major")
    host_buffer = make_host_buffer(kv, num_host_blocks=2)
    pool = HostBlockPool(host_buffer.num_blocks)
    leases = LeaseTable(pool, timeout_s=1.0)
    old_keys, new_keys = NAMESPACE.block_keys([b"old-0", b"old-1"]), NAMESPACE.block_keys([b"n"])
    with make_copy_engine(kv.layers, host_buffer, kv.block_dim) as engine:
        offload(pool, engine, [0, 1], old_keys)
        leases.lookup("slow-req", old_keys, now=0.0)
        assert pool.reserve(new_keys).refused == 1
        assert [lease.req_id for lease in leases.expire(now=1.5)] == ["slow-req"]
        reservation = offload(pool, engine, [9], new_keys)
    assert reservation.evicted_keys == [old_keys[0]]
    assert pool.lookup(old_keys) == []  # the prefix lost its first block: no partial hit
    assert torch.equal(
        host_buffer.block(reservation.host_block_ids[0]).contiguous().view(torch.int16),
        kv.block_bits(9),
    )
