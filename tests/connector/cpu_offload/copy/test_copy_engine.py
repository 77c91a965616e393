"""CPU copy engine: byte-exact round trips for each KV layout, async behaviour, failures."""

import sys
import threading
import time

import pytest
import torch

from kvscope.connector.cpu_offload.copy.cpu import CpuCopyEngine
from kvscope.connector.cpu_offload.copy.engine import Direction
from kvscope.connector.cpu_offload.copy.factory import make_copy_engine
from kvscope.connector.cpu_offload.copy.host_buffer import BlockLayout, HostBuffer


def test_store_then_load_round_trips_bytes_exactly(
    layout, block_plan, make_kv_cache, make_host_buffer
):
    device_block_ids, host_block_ids = block_plan
    source = make_kv_cache(layout, seed=1)
    expected = {d: source.block_bits(d) for d in device_block_ids}
    host_buffer = make_host_buffer(source, num_host_blocks=16)
    with make_copy_engine(source.layers, host_buffer, source.block_dim) as engine:
        engine.submit_store(device_block_ids, host_block_ids)
        [stored] = engine.drain(timeout_s=10)
    assert stored.ok and stored.direction is Direction.STORE

    # Load into other device blocks of a second engine's cache, as a later request would.
    target = make_kv_cache(layout, seed=2)
    untouched_before = target.block_bits(0)
    target_ids = [(d + 7) % target.num_blocks or 23 for d in device_block_ids]
    with make_copy_engine(target.layers, host_buffer, target.block_dim) as engine:
        engine.submit_load(target_ids, host_block_ids)
        [loaded] = engine.drain(timeout_s=10)
    assert loaded.ok and loaded.num_blocks == len(host_block_ids)
    for device_block_id, target_id in zip(device_block_ids, target_ids, strict=True):
        assert torch.equal(target.block_bits(target_id), expected[device_block_id])
    if 0 not in target_ids:
        assert torch.equal(target.block_bits(0), untouched_before)


@pytest.mark.parametrize("layout", ["cpu_layer_major", "flash"])
def test_every_bit_pattern_survives_including_nans(layout, make_kv_cache, make_host_buffer):
    kv = make_kv_cache(layout)
    generator = torch.Generator().manual_seed(3)
    for layer in kv.layers:  # all 65536 bf16 bit patterns are likely, NaN payloads included
        bits = torch.randint(-(2**15), 2**15, layer.shape, dtype=torch.int16, generator=generator)
        layer.view(torch.int16).copy_(bits)
    expected = [kv.block_bits(d) for d in (4, 9, 2)]
    host_buffer = make_host_buffer(kv, num_host_blocks=8)
    with make_copy_engine(kv.layers, host_buffer, kv.block_dim) as engine:
        engine.submit_store([4, 9, 2], [5, 1, 3])
        engine.submit_load([11, 0, 7], [5, 1, 3])
        assert all(result.ok for result in engine.drain(timeout_s=10))
    for device_block_id, bits in zip([11, 0, 7], expected, strict=True):
        assert torch.equal(kv.block_bits(device_block_id), bits)


def test_results_report_bytes_and_duration(make_kv_cache, make_host_buffer):
    kv = make_kv_cache("cpu_layer_major")
    host_buffer = make_host_buffer(kv, num_host_blocks=8)
    with CpuCopyEngine(kv.layers, host_buffer, kv.block_dim) as engine:
        job_id = engine.submit_store([0, 1, 2], [0, 1, 2])
        assert engine.wait(job_id, timeout_s=10)
        [result] = engine.poll()
    assert result.job_id == job_id
    assert result.num_bytes == 3 * host_buffer.layout.bytes_per_block
    assert result.duration_s > 0 and result.gib_per_s > 0
    assert engine.poll() == []  # each result is handed out once


def test_submit_returns_before_the_copy_and_the_caller_keeps_working(
    make_kv_cache, make_host_buffer
):
    kv = make_kv_cache("flash")
    host_buffer = make_host_buffer(kv, num_host_blocks=8)
    with CpuCopyEngine(kv.layers, host_buffer, kv.block_dim) as engine:
        started = time.monotonic()
        job_id = engine.submit_load([0, 1], [0, 1], delay_s=0.3)
        assert time.monotonic() - started < 0.1
        assert engine.poll() == [] and engine.num_pending == 1
        # The engine's own work runs meanwhile on this thread.
        product = torch.ones(64, 64) @ torch.ones(64, 64)
        assert product[0, 0] == 64
        assert engine.wait(job_id, timeout_s=0.01) is False
        assert engine.wait(job_id, timeout_s=5)
        [result] = engine.poll()
    assert result.finished_at - result.submitted_at >= 0.3


def test_copies_overlap_a_busy_caller_thread():
    """The caller's own torch work runs while a large copy is still in flight."""
    kv_layers = list(torch.ones(2, 4096, 2, 32, 64, dtype=torch.bfloat16))  # 64 MiB
    host_buffer = HostBuffer(BlockLayout.of(kv_layers, block_dim=0), num_blocks=4096)
    with CpuCopyEngine(kv_layers, host_buffer, block_dim=0) as engine:
        job_id = engine.submit_store(list(range(4096)), list(range(4096)))
        work_done_while_copying = 0
        while not engine.wait(job_id, timeout_s=0):
            torch.randn(64, 64) @ torch.randn(64, 64)  # the "forward pass"
            work_done_while_copying += 1
        [result] = engine.poll()
    assert result.ok and work_done_while_copying > 0
    assert torch.equal(host_buffer.storage, torch.ones_like(host_buffer.storage))


def test_idle_worker_does_not_spin(make_kv_cache, make_host_buffer):
    kv = make_kv_cache("cpu_layer_major")
    with CpuCopyEngine(kv.layers, make_host_buffer(kv, 4), kv.block_dim) as engine:
        engine.submit_store([0], [0])
        engine.drain(timeout_s=5)
        cpu_before, wall_before = time.process_time(), time.monotonic()
        time.sleep(0.3)
        cpu_used = time.process_time() - cpu_before
        wall = time.monotonic() - wall_before
    assert cpu_used < 0.2 * wall


def test_jobs_finish_in_submission_order(make_kv_cache, make_host_buffer):
    kv = make_kv_cache("cpu_block_major")
    with CpuCopyEngine(kv.layers, make_host_buffer(kv, 8), kv.block_dim) as engine:
        job_ids = [engine.submit_store([n], [n]) for n in range(6)]
        job_ids.append(engine.submit_load([10, 11], [0, 1]))
        results = engine.drain(timeout_s=10)
    assert [r.job_id for r in results] == job_ids


def test_a_failing_copy_is_reported_and_the_engine_keeps_working(make_kv_cache, make_host_buffer):
    kv, other = make_kv_cache("cpu_layer_major"), make_kv_cache("cpu_layer_major")
    host_buffer = make_host_buffer(kv, 4)
    with CpuCopyEngine(kv.layers, host_buffer, kv.block_dim) as engine:
        # The engine released its KV memory under us (as vLLM's sleep mode does).
        kv.layers[0].untyped_storage().resize_(0)
        engine.submit_load([0, 1], [0, 1])
        engine.submit_load([3], [3], fail_reason="injected: test")
        failed_load, injected = engine.drain(timeout_s=10)
    with CpuCopyEngine(other.layers, host_buffer, other.block_dim) as engine:
        engine.submit_store([2], [2])
        [store] = engine.drain(timeout_s=10)
    assert not failed_load.ok and "out of bounds for storage" in failed_load.error
    assert injected.error == "InjectedFault: injected: test"
    assert store.ok


@pytest.mark.parametrize(
    ("device_block_ids", "host_block_ids", "message"),
    [
        ([0, 1], [0], "2 device blocks but 1 host blocks"),
        ([0, 0], [0, 1], "repeated device block ids"),
        ([0], [99], r"host block id 99 out of range \[0, 4\)"),
        ([-1], [0], "device block id -1 out of range"),
    ],
)
def test_bad_block_ids_are_refused_at_submit(
    device_block_ids, host_block_ids, message, make_kv_cache, make_host_buffer
):
    kv = make_kv_cache("flash")
    with CpuCopyEngine(kv.layers, make_host_buffer(kv, 4), kv.block_dim) as engine:
        with pytest.raises(ValueError, match=message):
            engine.submit_store(device_block_ids, host_block_ids)
        assert engine.num_pending == 0


def test_shutdown_finishes_queued_jobs_then_joins(make_kv_cache, make_host_buffer):
    kv = make_kv_cache("cpu_layer_major")
    engine = CpuCopyEngine(kv.layers, make_host_buffer(kv, 8), kv.block_dim)
    for n in range(4):
        engine.submit_store([n], [n])
    engine.shutdown(timeout_s=10)
    assert not engine._worker.is_alive()
    assert len(engine.poll()) == 4
    with pytest.raises(RuntimeError, match="shut down"):
        engine.submit_store([0], [0])
    engine.shutdown()  # twice is harmless


def test_shutdown_cuts_injected_delays_short(make_kv_cache, make_host_buffer):
    kv = make_kv_cache("cpu_layer_major")
    engine = CpuCopyEngine(kv.layers, make_host_buffer(kv, 8), kv.block_dim)
    engine.submit_load([0], [0], delay_s=30)
    started = time.monotonic()
    engine.shutdown(timeout_s=10)
    assert time.monotonic() - started < 5
    assert [r.ok for r in engine.poll()] == [True]


def test_host_buffer_that_does_not_fit_the_kv_is_rejected(make_kv_cache, make_host_buffer):
    kv, other = make_kv_cache("flash"), make_kv_cache("cpu_layer_major")
    with pytest.raises(ValueError, match="does not fit"):
        CpuCopyEngine(kv.layers, make_host_buffer(other, 4), kv.block_dim)


def test_the_worker_thread_count_does_not_leak_into_other_threads(make_kv_cache, make_host_buffer):
    threads_before = torch.get_num_threads()
    seen_by_new_thread: list[int] = []
    kv = make_kv_cache("cpu_layer_major")
    with CpuCopyEngine(kv.layers, make_host_buffer(kv, 2), kv.block_dim, num_threads=1):
        probe = threading.Thread(target=lambda: seen_by_new_thread.append(torch.get_num_threads()))
        probe.start()
        probe.join()
    assert torch.get_num_threads() == threads_before
    assert seen_by_new_thread == [threads_before]


@pytest.mark.parametrize("last_dim", [64, 6, 3])  # 16-byte, 4-byte and 2-byte element views
def test_round_trip_whatever_the_innermost_width(last_dim):
    kv_layers = list(torch.randn(2, 10, 4, last_dim).to(torch.bfloat16))
    expected = [layer[[7, 2]].clone() for layer in kv_layers]
    host_buffer = HostBuffer(BlockLayout.of(kv_layers, block_dim=0), num_blocks=4)
    with CpuCopyEngine(kv_layers, host_buffer, block_dim=0) as engine:
        engine.submit_store([7, 2], [3, 0])
        engine.submit_load([1, 5], [3, 0])
        assert all(result.ok for result in engine.drain(timeout_s=10))
    for layer, blocks in zip(kv_layers, expected, strict=True):
        assert torch.equal(layer[[1, 5]].view(torch.int16), blocks.view(torch.int16))


def test_cancel_stops_a_delayed_job_before_it_copies():
    import torch

    from kvscope.connector.cpu_offload.copy.cpu import CpuCopyEngine
    from kvscope.connector.cpu_offload.copy.host_buffer import BlockLayout, HostBuffer

    kv = torch.zeros(8, 2, 32, 64, dtype=torch.bfloat16)
    buffer = HostBuffer(BlockLayout.of([kv], 0), 4)
    buffer.layers[0].fill_(1)
    with CpuCopyEngine([kv], buffer, 0) as engine:
        slow = engine.submit_load([0], [0], delay_s=5.0)
        after = engine.submit_load([1], [1])
        assert engine.cancel(slow)
        assert engine.wait(after, timeout_s=2), "a cancelled delay must not hold later jobs"
        results = {r.job_id: r for r in engine.drain(timeout_s=2)}
    assert results[slow].error == "cancelled" and results[after].ok
    assert kv[0].abs().sum() == 0, "the cancelled load never wrote its block"
    assert kv[1].abs().sum() > 0
    assert not engine.cancel(after), "a finished job cannot be cancelled"


@pytest.fixture
def gil_kept_until_blocking():
    """The test's thread keeps the GIL until it blocks (or a torch copy lets go of it): the
    copy thread, woken by a submit, cannot take a job before the test waits for it."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(30.0)
    yield
    sys.setswitchinterval(interval)


def copying_threads(engine, monkeypatch) -> dict[int, str]:
    """Which thread copied each job, by job id (the engine's own copy, recorded)."""
    seen: dict[int, str] = {}
    real_copy = engine._copy

    def recorded(job):
        seen[job.job_id] = threading.current_thread().name
        return real_copy(job)

    monkeypatch.setattr(engine, "_copy", recorded)
    return seen


def test_a_job_waited_for_is_copied_on_the_waiting_thread(
    gil_kept_until_blocking, make_kv_cache, make_host_buffer, monkeypatch
):
    kv = make_kv_cache("cpu_layer_major")
    with CpuCopyEngine(kv.layers, make_host_buffer(kv, 8), kv.block_dim) as engine:
        seen = copying_threads(engine, monkeypatch)
        first = engine.submit_store([1, 2], [0, 1])
        second = engine.submit_load([5, 6], [0, 1])
        assert engine.wait(first)  # next in line: copied here
        assert engine.wait(second, timeout_s=10)  # with a timeout: left to the worker
        results = engine.drain(timeout_s=10)
    assert seen == {first: threading.current_thread().name, second: "kvscope-copy"}
    assert [r.job_id for r in results] == [first, second] and all(r.ok for r in results)
    assert torch.equal(kv.block_bits(5), kv.block_bits(1)), "the load read what the store wrote"


def test_a_job_behind_another_is_left_to_the_worker_in_order(
    gil_kept_until_blocking, make_kv_cache, make_host_buffer, monkeypatch
):
    """A waiter copies only the next job: jobs run one at a time, in submission order (a load
    ends before a later store overwrites the host blocks it reads)."""
    kv = make_kv_cache("cpu_layer_major")
    with CpuCopyEngine(kv.layers, make_host_buffer(kv, 8), kv.block_dim) as engine:
        seen = copying_threads(engine, monkeypatch)
        delayed = engine.submit_store([1], [0], delay_s=0.05)
        jobs = [delayed, *(engine.submit_store([n], [n]) for n in range(2, 5))]
        assert engine.wait(jobs[-1])
        results = engine.drain(timeout_s=10)
    assert set(seen.values()) == {"kvscope-copy"}
    assert [r.job_id for r in results] == jobs


def test_shutdown_while_a_waiter_copies_still_joins_the_worker(
    gil_kept_until_blocking, make_kv_cache, make_host_buffer, monkeypatch
):
    kv = make_kv_cache("cpu_layer_major")
    engine = CpuCopyEngine(kv.layers, make_host_buffer(kv, 8), kv.block_dim)
    copying, release = threading.Event(), threading.Event()
    real_copy = engine._copy

    def held_copy(job):
        copying.set()
        release.wait(10)
        return real_copy(job)

    monkeypatch.setattr(engine, "_copy", held_copy)
    shut_down = []

    def shut_down_meanwhile():
        copying.wait(10)
        threading.Timer(0.2, release.set).start()
        engine.shutdown(timeout_s=10)
        shut_down.append(engine._worker.is_alive())

    other = threading.Thread(target=shut_down_meanwhile)
    other.start()
    job_id = engine.submit_store([1], [0])
    assert engine.wait(job_id)  # copied here; the worker is told to stop meanwhile
    other.join(15)
    assert shut_down == [False], "the worker exits once the waiter's copy ends"
    assert [r.ok for r in engine.poll()] == [True]
