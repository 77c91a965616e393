"""CudaCopyEngine's logic on the CPU through fake streams and events: two streams at the
lowest priority and their ordering, cancel of a copy a stream cannot drop, no host waits,
byte-exact copies over vLLM's views (direct or chunked through the reused staging buffer)."""

import pytest
import torch

from kvscope.connector.cpu_offload.copy.cuda import CudaCopyEngine
from kvscope.connector.cpu_offload.copy.engine import Direction
from tests.connector.cpu_offload.copy.fake_streams import FakeGpu


def engine_on(kv, host_buffer, staging_bytes: int = 1 << 20) -> tuple[CudaCopyEngine, FakeGpu]:
    gpu = FakeGpu()
    engine = CudaCopyEngine(
        kv.layers, host_buffer, kv.block_dim, ops=gpu, staging_bytes=staging_bytes
    )
    return engine, gpu


@pytest.mark.parametrize("chunk_blocks", [1, 2, 64])
def test_staged_round_trip_is_byte_exact(
    layout, block_plan, chunk_blocks, make_kv_cache, make_host_buffer
):
    device_block_ids, host_block_ids = block_plan
    source = make_kv_cache(layout, seed=1)
    expected = {d: source.block_bits(d) for d in device_block_ids}
    host_buffer = make_host_buffer(source, num_host_blocks=16)
    layer_block_bytes = host_buffer.layout.bytes_per_layer_block
    engine, gpu = engine_on(source, host_buffer, chunk_blocks * layer_block_bytes)
    row_bytes = engine.host_tables[0][0].numel() * 2  # a layer's block, or all layers' (BL*)
    expected_capacity = max(1, min(chunk_blocks * layer_block_bytes // row_bytes, 24))
    assert engine.lanes[Direction.STORE].staging.capacity == expected_capacity
    engine.submit_store(device_block_ids, host_block_ids)
    gpu.run_all()
    [stored] = engine.poll()
    assert stored.ok, stored.error
    target = make_kv_cache(layout, seed=2)
    untouched = {b: target.block_bits(b) for b in range(target.num_blocks)}
    target_ids = [(d + 7) % target.num_blocks for d in device_block_ids]
    engine, gpu = engine_on(target, host_buffer, chunk_blocks * layer_block_bytes)
    engine.submit_load(target_ids, host_block_ids)
    gpu.run_all()
    [loaded] = engine.poll()
    assert loaded.ok, loaded.error
    for device_block_id, target_id in zip(device_block_ids, target_ids, strict=True):
        assert torch.equal(target.block_bits(target_id), expected[device_block_id])
    for block_id in set(range(target.num_blocks)) - set(target_ids):
        assert torch.equal(target.block_bits(block_id), untouched[block_id]), block_id


def test_loads_and_stores_run_on_their_own_streams_at_the_lowest_priority(
    make_kv_cache, make_host_buffer
):
    kv = make_kv_cache("LBNHC")
    engine, gpu = engine_on(kv, make_host_buffer(kv, num_host_blocks=8))
    load_stream = engine.lanes[Direction.LOAD].stream
    store_stream = engine.lanes[Direction.STORE].stream
    assert load_stream is not store_stream
    lowest, _ = gpu.PRIORITY_RANGE
    assert load_stream.priority == store_stream.priority == lowest, (
        "KV copies yield to the forward's kernels, loads included"
    )
    store = engine.submit_store([1, 2], [0, 1])
    load = engine.submit_load([5], [2])
    assert load_stream.waited_on == [gpu.compute], "a load waits for compute, never stores"
    store_stream.waited_on.clear()
    engine.submit_store([3], [3])
    load_entry = engine._find(load)
    assert store_stream.waited_on == [gpu.compute, load_entry.finished], (
        "a store waits for the loads before it: they may read the host blocks it overwrites"
    )
    load_stream.run()  # the load is done while the first store is still copying
    assert [r.job_id for r in engine.poll()] == [load]
    assert engine.num_pending == 2 and store in {
        e.job.job_id for e in engine.lanes[Direction.STORE].in_flight
    }


def test_submitting_and_polling_never_wait_for_the_gpu(make_kv_cache, make_host_buffer):
    kv = make_kv_cache("cpu_layer_major")
    engine, gpu = engine_on(kv, make_host_buffer(kv, num_host_blocks=8))
    for step in range(20):
        engine.submit_store([step % 8], [step % 8])
        engine.submit_load([(step + 3) % 8 + 8], [(step + 5) % 8])
        assert engine.poll() == []  # the GPU is "busy": nothing finished, nothing waited for
    assert gpu.host_syncs == 0 and engine.num_pending == 40
    gpu.run_all()
    assert len(engine.poll()) == 40 and engine.num_pending == 0


def test_cancel_of_a_running_load_fails_it_once_its_copy_ended(make_kv_cache, make_host_buffer):
    kv = make_kv_cache("flash")
    engine, gpu = engine_on(kv, make_host_buffer(kv, num_host_blocks=8))
    load = engine.submit_load([4], [1])
    assert not engine.cancel(load), "still copying: its blocks are not free yet"
    assert engine.poll() == [] and engine.num_pending == 1
    gpu.run_all()
    [result] = engine.poll()
    assert result.job_id == load and result.error == "cancelled"
    assert not engine.cancel(load), "a reported job cannot be cancelled"


def test_cancel_of_a_copied_but_delayed_load_is_over_at_once(make_kv_cache, make_host_buffer):
    kv = make_kv_cache("flash")
    engine, gpu = engine_on(kv, make_host_buffer(kv, num_host_blocks=8))
    delayed = engine.submit_load([4], [1], delay_s=60.0)
    later = engine.submit_load([5], [2])
    gpu.run_all()
    assert [r.job_id for r in engine.poll()] == [later], "a delay holds only its own job"
    assert engine.cancel(delayed), "its copy is over: nothing can still write its blocks"
    [result] = engine.poll()
    assert result.job_id == delayed and result.error == "cancelled"


def test_wait_is_the_only_host_wait(make_kv_cache, make_host_buffer):
    kv = make_kv_cache("flash")
    engine, gpu = engine_on(kv, make_host_buffer(kv, num_host_blocks=8))
    first = engine.submit_store([1], [1])
    second = engine.submit_store([2], [2])
    assert engine.wait(first) and gpu.host_syncs == 1
    assert [r.job_id for r in engine.poll()] == [first], "only the job waited for finished"
    assert engine.wait(second, timeout_s=0.01) is False, "a timed wait never blocks on the GPU"
    assert gpu.host_syncs == 1
    engine.shutdown()
    assert [r.job_id for r in engine.poll()] == [second]


def test_an_injected_failure_is_reported_without_copying(make_kv_cache, make_host_buffer):
    kv = make_kv_cache("flash")
    before = kv.block_bits(6)
    engine, gpu = engine_on(kv, make_host_buffer(kv, num_host_blocks=8))
    engine.submit_load([6], [0], fail_reason="injected: test")
    gpu.run_all()
    [result] = engine.poll()
    assert result.error == "InjectedFault: injected: test", "worded as the CPU engine words it"
    assert torch.equal(kv.block_bits(6), before)
