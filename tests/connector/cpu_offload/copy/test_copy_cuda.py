"""CUDA copy engine: registered host buffer, lowest-priority side streams, event polling;
skipped without a GPU."""

import time

import pytest
import torch

from kvscope.connector.cpu_offload.copy import host_pinning
from kvscope.connector.cpu_offload.copy.engine import Direction
from kvscope.connector.cpu_offload.copy.factory import make_copy_engine
from kvscope.connector.cpu_offload.copy.host_buffer import BlockLayout, HostBuffer

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

GPU_BUSY_CYCLES = 200_000_000  # about 0.1 s of one SM spinning on the compute stream


def test_cuda_round_trip_is_byte_exact(layout, block_plan, make_kv_cache, make_host_buffer):
    device_block_ids, host_block_ids = block_plan
    source = make_kv_cache(layout, device="cuda", seed=1)
    expected = {d: source.block_bits(d) for d in device_block_ids}
    host_buffer = make_host_buffer(source, num_host_blocks=16, pin_memory=True)
    assert host_buffer.pinned
    with make_copy_engine(source.layers, host_buffer, source.block_dim) as engine:
        assert type(engine).__name__ == "CudaCopyEngine"
        engine.submit_store(device_block_ids, host_block_ids)
        [stored] = engine.drain(timeout_s=30)
    assert stored.ok, stored.error
    target = make_kv_cache(layout, device="cuda", seed=2)
    untouched_before = target.block_bits(0)
    target_ids = [(d + 7) % target.num_blocks or 23 for d in device_block_ids]
    with make_copy_engine(target.layers, host_buffer, target.block_dim) as engine:
        engine.submit_load(target_ids, host_block_ids)
        [loaded] = engine.drain(timeout_s=30)
    assert loaded.ok, loaded.error
    for device_block_id, target_id in zip(device_block_ids, target_ids, strict=True):
        assert torch.equal(target.block_bits(target_id), expected[device_block_id])
    if 0 not in target_ids:
        assert torch.equal(target.block_bits(0), untouched_before)


def test_store_sees_kv_written_on_the_compute_stream_just_before(make_kv_cache, make_host_buffer):
    kv = make_kv_cache("LBNHC", device="cuda")
    host_buffer = make_host_buffer(kv, num_host_blocks=4, pin_memory=True)
    with make_copy_engine(kv.layers, host_buffer, kv.block_dim) as engine:
        torch.cuda._sleep(GPU_BUSY_CYCLES)  # the "forward pass" is still running...
        for layer in kv.layers:
            layer[3].fill_(7.0)  # ...and writes this block when it ends
        started = time.monotonic()
        engine.submit_store([3], [1])
        submit_s = time.monotonic() - started
        assert engine.poll() == []  # still behind the compute stream's work
        [result] = engine.drain(timeout_s=30)
    assert result.ok and submit_s < 0.05
    assert bool((host_buffer.block(1) == 7.0).all())


def test_compute_stream_can_wait_for_a_load_without_blocking_the_host(
    make_kv_cache, make_host_buffer
):
    kv = make_kv_cache("LBHNC", device="cuda", seed=3)
    host_buffer = make_host_buffer(kv, num_host_blocks=4, pin_memory=True)
    host_buffer.block(2).fill_(5.0)
    with make_copy_engine(kv.layers, host_buffer, kv.block_dim) as engine:
        job_id = engine.submit_load([9], [2])
        engine.make_compute_stream_wait(job_id)
        total = sum(layer[9].float().sum() for layer in kv.layers)  # runs after the load
        assert total.item() == 5.0 * host_buffer.block(2).numel()
        engine.drain(timeout_s=30)


def test_cuda_failures_and_delays_are_reported_through_poll(make_kv_cache, make_host_buffer):
    kv = make_kv_cache("LBHNC", device="cuda")
    host_buffer = make_host_buffer(kv, num_host_blocks=4, pin_memory=True)
    with make_copy_engine(kv.layers, host_buffer, kv.block_dim) as engine:
        engine.submit_store([2], [2], delay_s=0.05)
        engine.submit_load([3], [3], fail_reason="injected: test")
        torch.cuda.synchronize()
        kv.layers[0].untyped_storage().resize_(0)  # KV memory released under the engine
        engine.submit_load([0, 1], [0, 1])  # a slice: the view check raises
        delayed, injected, failed = engine.drain(timeout_s=30)
    assert delayed.ok and delayed.finished_at - delayed.submitted_at >= 0.05
    assert injected.error == "InjectedFault: injected: test"
    assert "out of bounds for storage" in failed.error


def test_copies_run_at_the_lowest_priority_and_loads_never_wait_for_stores(
    make_kv_cache, make_host_buffer
):
    kv = make_kv_cache("LBNHC", device="cuda")
    host_buffer = make_host_buffer(kv, num_host_blocks=8, pin_memory=True)
    with make_copy_engine(kv.layers, host_buffer, kv.block_dim) as engine:
        load_stream = engine.lanes[Direction.LOAD].stream
        store_stream = engine.lanes[Direction.STORE].stream
        lowest, highest = torch.cuda.Stream.priority_range()
        assert lowest != highest, "this GPU has stream priorities"
        assert load_stream.priority == store_stream.priority == lowest, "KV I/O yields"
        with torch.cuda.stream(store_stream):
            torch.cuda._sleep(GPU_BUSY_CYCLES)  # offloading is busy...
        store = engine.submit_store([1], [1])
        load = engine.submit_load([5], [2])  # ...and a resuming request's load goes past it
        assert engine.wait(load, timeout_s=30)
        assert [r.job_id for r in engine.poll()] == [load]
        assert engine.num_pending == 1 and engine.wait(store, timeout_s=30)


def test_cancel_fails_a_queued_load_and_holds_it_until_the_copy_ended(
    make_kv_cache, make_host_buffer
):
    kv = make_kv_cache("BLNHC", device="cuda")
    host_buffer = make_host_buffer(kv, num_host_blocks=8, pin_memory=True)
    with make_copy_engine(kv.layers, host_buffer, kv.block_dim) as engine:
        torch.cuda._sleep(GPU_BUSY_CYCLES)  # the load waits behind the compute stream
        load = engine.submit_load([4], [1])
        assert not engine.cancel(load), "queued on a stream: it cannot be withdrawn"
        assert engine.poll() == []
        [result] = engine.drain(timeout_s=30)
    assert result.job_id == load and result.error == "cancelled"


def test_submitting_and_polling_make_no_synchronising_call(make_kv_cache, make_host_buffer):
    kv = make_kv_cache("BLNHC", device="cuda")
    host_buffer = make_host_buffer(kv, num_host_blocks=8, pin_memory=True)
    with make_copy_engine(kv.layers, host_buffer, kv.block_dim) as engine:
        engine.submit_load([3, 9], [0, 1])  # warm-up: first pinned and device allocations
        engine.drain(timeout_s=30)
        torch.cuda.set_sync_debug_mode("error")
        try:
            for step in range(8):
                engine.submit_store([step, 23 - step], [step % 4, 4 + step % 4])
                engine.submit_load([10 + step], [step])
                engine.poll()
        finally:
            torch.cuda.set_sync_debug_mode(0)
        assert all(r.ok for r in engine.drain(timeout_s=30))


def host_allocator_bytes() -> int:
    """Bytes torch's caching pinned allocator holds (its key changed name across versions)."""
    if not hasattr(torch.cuda, "host_memory_stats"):
        pytest.skip("this torch has no torch.cuda.host_memory_stats")
    stats = torch.cuda.host_memory_stats()
    for key in ("allocated_bytes.current", "reserved_bytes.current"):
        if key in stats:
            return int(stats[key])
    raise AssertionError(f"no byte count in torch.cuda.host_memory_stats(): {sorted(stats)}")


def test_a_pinned_pool_of_odd_size_is_registered_exactly_not_rounded_up(make_kv_cache):
    kv = make_kv_cache("LBHNC", device="cuda")
    layout = BlockLayout.of(kv.layers, 0)
    num_blocks = int(1.5 * 2**30) // layout.bytes_per_block + 1  # 1.5 GiB and one block
    torch.cuda.synchronize()
    allocator_before = host_allocator_bytes()
    started = time.perf_counter()
    host_buffer = HostBuffer(layout, num_blocks, pin_memory=True)
    register_s = time.perf_counter() - started
    try:
        expected = num_blocks * layout.bytes_per_block
        assert host_buffer.pinned and host_buffer.nbytes == expected
        assert host_buffer.registered_bytes == expected, "registered exactly, not 2 GiB"
        assert host_buffer.storage.is_pinned(), "page-locked (cudaPointerGetAttributes)"
        assert host_buffer.layers[-1][-1].is_pinned(), "to its last block"
        assert host_allocator_bytes() == allocator_before, "torch's pinned allocator not used"
        with make_copy_engine(kv.layers, host_buffer, 0) as engine:
            engine.submit_store([1, 2], [num_blocks - 2, num_blocks - 1])
            [stored] = engine.drain(timeout_s=30)
        assert stored.ok, stored.error
        for host_id, device_id in ((num_blocks - 2, 1), (num_blocks - 1, 2)):
            stored_bits = host_buffer.block(host_id).contiguous().view(torch.int16)
            assert torch.equal(stored_bits, kv.block_bits(device_id).cpu())
        print(f"registered {expected / 2**30:.2f} GiB in {register_s:.2f} s")
    finally:
        host_buffer.close()
    assert host_buffer.registered_bytes == 0 and not host_buffer.storage.is_pinned()


def test_a_store_across_a_registration_edge_stays_behind_a_busy_compute_stream(
    make_kv_cache, make_host_buffer, monkeypatch
):
    """Chunks of two blocks: the store's run of five host blocks crosses two edges, and is cut
    there; each piece must stay asynchronous (a range the driver took as pageable would copy
    synchronously, and submit would wait for the busy stream)."""
    kv = make_kv_cache("BLNHC", device="cuda")
    layout = BlockLayout.of(kv.layers, kv.block_dim)
    monkeypatch.setattr(host_pinning, "REGISTER_CHUNK_BYTES", 2 * layout.bytes_per_block)
    host_buffer = make_host_buffer(kv, num_host_blocks=8, pin_memory=True)
    assert host_buffer.pinned and host_buffer.registration_blocks == 2
    expected = {d: kv.block_bits(d) for d in (3, 4, 5, 6, 7)}
    with make_copy_engine(kv.layers, host_buffer, kv.block_dim) as engine:
        torch.cuda._sleep(GPU_BUSY_CYCLES)
        started = time.monotonic()
        engine.submit_store([3, 4, 5, 6, 7], [1, 2, 3, 4, 5])
        submit_s = time.monotonic() - started
        assert engine.poll() == [], "the store ran before the compute stream's work"
        [stored] = engine.drain(timeout_s=30)
    assert stored.ok, stored.error
    assert submit_s < 0.05, f"submit waited {submit_s:.3f} s: a piece copied synchronously"
    for device_id, host_id in zip(expected, (1, 2, 3, 4, 5), strict=True):
        stored_bits = host_buffer.block(host_id).contiguous().view(torch.int16)
        assert torch.equal(stored_bits, expected[device_id].cpu())


def test_a_refused_registration_leaves_the_next_launch_working(make_kv_cache):
    """Registering a range twice is refused (cudaErrorHostMemoryAlreadyRegistered); the error
    is cleared, so the next kernel launch on this thread runs."""
    kv = make_kv_cache("LBNHC", device="cuda")
    host_buffer = HostBuffer(BlockLayout.of(kv.layers, kv.block_dim), 4, pin_memory=True)
    assert host_buffer.pinned
    try:
        assert host_pinning.pin_tables(host_buffer._tables(), host_buffer.row_bytes) == []
        doubled = torch.arange(8, device="cuda") * 2  # raised the pending error before
        torch.cuda.synchronize()
        assert doubled.sum().item() == 56
    finally:
        host_buffer.close()
