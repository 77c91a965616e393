"""The offload worker over CudaCopyEngine's logic (fake streams, CPU memory): vLLM calls
handle_preemptions every step, and only preempted requests' stores are waited for; a load
past its timeout that a stream cannot drop is failed, and its blocks are reported (to vLLM
and to the scheduler half) only once its copy ended. Needs vLLM (skipped without it)."""

import threading
import time

import pytest
import torch

pytest.importorskip("vllm")

from vllm.v1.core.sched.output import CachedRequestData, SchedulerOutput  # noqa: E402

from kvscope.connector.cpu_offload.config import OffloadConfig  # noqa: E402
from kvscope.connector.cpu_offload.copy import cpu as copy_cpu  # noqa: E402
from kvscope.connector.cpu_offload.copy.cuda import CudaCopyEngine  # noqa: E402
from kvscope.connector.cpu_offload.faults import FaultInjector, FaultPlan  # noqa: E402
from kvscope.connector.cpu_offload.host_pool import KVNamespace  # noqa: E402
from kvscope.connector.cpu_offload.metadata import BlockTransfer, OffloadMetadata  # noqa: E402
from kvscope.connector.cpu_offload.request_state import PlannedStore  # noqa: E402
from kvscope.connector.cpu_offload.scheduler import OffloadScheduler  # noqa: E402
from kvscope.connector.cpu_offload.worker import OffloadWorker  # noqa: E402
from tests.connector.cpu_offload.copy.fake_streams import FakeGpu  # noqa: E402

NUM_BLOCKS = 16


def make_worker(load_timeout_s: float = 10.0, fake_gpu: bool = True, load_delay_ms: float = 0):
    config = OffloadConfig(cpu_bytes_to_use=2**20, load_timeout_s=load_timeout_s)
    faults = FaultInjector(FaultPlan(load_delay_ms=load_delay_ms))
    worker = OffloadWorker(config, faults, NUM_BLOCKS)
    kv = torch.randn(2, NUM_BLOCKS, 2, 32, 32).to(torch.bfloat16)
    worker.register({"layer.0": kv[0], "layer.1": kv[1]})
    gpu = FakeGpu()
    if fake_gpu:
        worker.copies.shutdown()
        worker.copies = CudaCopyEngine(list(kv.unbind(0)), worker.buffer, 0, ops=gpu)
    return worker, gpu


def plan(worker, loads=(), stores=(), preempted=()) -> OffloadMetadata:
    return OffloadMetadata(
        list(loads), list(stores), set(), set(preempted), worker.buffer.num_blocks
    )


def test_handle_preemptions_waits_only_for_the_preempted_requests_stores():
    worker, gpu = make_worker()
    stores = [BlockTransfer("r1", (1, 2), (0, 1), 1), BlockTransfer("r2", (3,), (2,), 2)]
    worker.start_stores(plan(worker, stores=stores))
    worker.wait_for_stores(plan(worker).reqs_preempted)  # a step without preemptions
    assert gpu.host_syncs == 0, "no preemption, no host wait"
    worker.wait_for_stores({"r1"})
    assert gpu.host_syncs == 1
    worker.poll()
    meta = worker.take_worker_meta()
    assert meta.stores_done == {1: 1}, "r1's store is over; r2's still copies"
    gpu.run_all()
    worker.poll()
    assert worker.take_worker_meta().stores_done == {2: 1}


def test_a_timed_out_load_keeps_its_blocks_until_its_copy_ended():
    worker, gpu = make_worker(load_timeout_s=0.01)
    load = BlockTransfer("r1", (4, 5), (0, 1), 7)
    worker.start_loads(plan(worker, loads=[load]))
    time.sleep(0.02)
    assert worker.poll() == (set(), set()), "still copying: vLLM must not get r1 back yet"
    assert worker.take_load_errors() == set() and worker.take_worker_meta() is None
    gpu.run_all()  # the stream reaches the end of the load
    assert worker.poll() == (set(), {"r1"})
    assert worker.take_load_errors() == {4, 5}, "failed at its deadline, though it copied"
    assert worker.take_worker_meta().loads_failed == {"r1": 1}


def test_a_load_copied_but_held_by_a_delay_fails_at_its_deadline_at_once():
    worker, gpu = make_worker(load_timeout_s=0.01, load_delay_ms=60_000)
    worker.start_loads(plan(worker, loads=[BlockTransfer("r1", (4,), (0,), 7)]))
    gpu.run_all()  # the copy is over; only the injected delay holds the load back
    assert worker.poll() == (set(), set())
    time.sleep(0.02)
    assert worker.poll() == (set(), {"r1"}) and worker.take_load_errors() == {4}
    assert worker.poll() == (set(), set()), "reported once"


def test_a_load_that_ended_in_time_succeeds_even_when_polled_late():
    worker, gpu = make_worker(load_timeout_s=0.01)
    worker.start_loads(plan(worker, loads=[BlockTransfer("r1", (4,), (0,), 7)]))
    gpu.run_all()
    time.sleep(0.02)
    assert worker.poll() == (set(), {"r1"}) and worker.take_load_errors() == set()


def test_on_the_cpu_a_load_still_copying_at_its_deadline_fails_too(monkeypatch):
    release = threading.Event()
    real_load_rows = copy_cpu.load_rows

    def slow_load_rows(*args, **kwargs):
        release.wait(5)
        return real_load_rows(*args, **kwargs)

    monkeypatch.setattr(copy_cpu, "load_rows", slow_load_rows)
    worker, _ = make_worker(load_timeout_s=0.05, fake_gpu=False)
    worker.start_loads(plan(worker, loads=[BlockTransfer("r1", (4,), (0,), 7)]))
    time.sleep(0.1)
    assert worker.poll() == (set(), set()), "the copy runs on: the blocks stay held"
    release.set()
    deadline = time.monotonic() + 5
    while (finished := worker.poll()) == (set(), set()) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert finished == (set(), {"r1"}) and worker.take_load_errors() == {4}
    worker.shutdown()


def test_the_scheduler_half_names_preempted_requests_whose_stores_hold_no_blocks():
    """Only a store without vLLM references on its blocks (no block pool bound) needs the
    worker's wait; r9's holds them, r5 was not preempted, r7 has no store."""
    namespace = KVNamespace("tiny", "bfloat16", "cpu", 32, 0, 1, 2, 2, 32)
    offload = OffloadScheduler(OffloadConfig(), namespace, 32, 16, 1, FaultInjector())
    held = [object()]  # a KVCacheBlock the store took a reference on
    for store_id, (req_id, blocks) in enumerate([("r3", []), ("r9", held), ("r5", [])]):
        offload.stores.in_flight[store_id] = PlannedStore(req_id, [store_id], [b"k"], [0], blocks)
    output = SchedulerOutput(
        scheduled_new_reqs=[],
        scheduled_cached_reqs=CachedRequestData.make_empty(),
        num_scheduled_tokens={},
        total_num_scheduled_tokens=0,
        scheduled_spec_decode_tokens={},
        scheduled_encoder_inputs={},
        finished_req_ids=set(),
        free_encoder_mm_hashes=[],
        preempted_req_ids={"r3", "r9", "r7"},
    )
    assert offload.build_metadata(output, None).reqs_preempted == {"r3"}
    output.preempted_req_ids = None  # what vLLM sends when nothing was preempted
    assert offload.build_metadata(output, None).reqs_preempted == set()
