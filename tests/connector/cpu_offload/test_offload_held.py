"""held(): what each half of the offload connector still holds, over vLLM's own Request, a real
Scheduler and a real copy engine; all falsy once a load finished and its request ended."""

import time

import torch

from kvscope.connector.cpu_offload.config import OffloadConfig
from kvscope.connector.cpu_offload.faults import FaultInjector, FaultPlan
from kvscope.connector.cpu_offload.metadata import BlockTransfer, OffloadWorkerMeta
from kvscope.connector.cpu_offload.scheduler import OffloadScheduler
from kvscope.connector.cpu_offload.worker import OffloadWorker
from tests.connector.cpu_offload.copy.test_offload_stream_order import NUM_BLOCKS, plan
from tests.connector.cpu_offload.hma_harness import Engine
from tests.connector.cpu_offload.hma_harness import request as hma_request
from tests.connector.cpu_offload.test_offload_ranks import (
    BLOCK,
    FakeKVCacheManager,
    Output,
    make_scheduler,
    request,
    start_load,
    store_prompt,
)

SCHEDULER_KINDS = {
    "active_leases",
    "pinned_host_blocks",
    "tracked_requests",
    "stores_in_flight",
    "expired_leases_in_flight",
    "stores_reported_by_some_ranks",
    "loads_reported_by_some_ranks",
}


def held_kinds(held: dict[str, object]) -> set[str]:
    """The kinds of thing a half says it still holds."""
    return {kind for kind, value in held.items() if value}


def stored_and_ended(offload: OffloadScheduler) -> None:
    """r0's prompt stored by the only rank, r0 ended; held() names the store meanwhile."""
    r0 = request("r0")
    [store_id] = store_prompt(offload, r0)
    assert offload.held()["stores_in_flight"] == [store_id]
    offload.on_worker_output(OffloadWorkerMeta(stores_done={store_id: 1}))
    offload.finished(r0)


def test_an_idle_scheduler_half_holds_nothing_and_names_every_kind():
    offload = make_scheduler(world_size=1)
    assert set(offload.held()) == SCHEDULER_KINDS
    assert held_kinds(offload.held()) == set()


def test_a_leased_hit_is_held_until_its_load_finished_and_its_request_ended():
    offload = make_scheduler(world_size=1)
    stored_and_ended(offload)
    assert held_kinds(offload.held()) == set(), "a committed store and an ended request"

    req = request("r1")
    assert offload.lookup(req, 0) == (4 * BLOCK, True)
    [lease] = offload.leases.active()
    held = offload.held()
    assert held["active_leases"] == [lease.lease_id]
    assert held["pinned_host_blocks"] == 4 and held["tracked_requests"] == ["r1"]

    start_load(offload, req)
    offload.on_worker_output(OffloadWorkerMeta(loads_done={"r1": 1}))
    assert held_kinds(offload.held()) == {"tracked_requests"}, "the lease ends with the load"
    offload.finished(req)
    assert held_kinds(offload.held()) == set()


def test_a_copy_one_rank_of_two_reported_is_held_by_the_tally():
    offload = make_scheduler(world_size=2)
    [store_id] = store_prompt(offload, request("r0"))
    offload.on_worker_output(OffloadWorkerMeta(stores_done={store_id: 1}))
    assert offload.held()["stores_reported_by_some_ranks"] == [store_id]
    offload.on_worker_output(OffloadWorkerMeta(stores_done={store_id: 2}))  # both: committed
    start_load(offload, request("r1"))
    offload.on_worker_output(OffloadWorkerMeta(loads_done={"r1": 1}))
    assert offload.held()["loads_reported_by_some_ranks"] == ["r1"]
    offload.on_worker_output(OffloadWorkerMeta(loads_done={"r1": 1}))
    assert offload.held()["loads_reported_by_some_ranks"] == []


def test_an_expired_lease_is_held_while_its_load_still_reads_the_blocks():
    offload = make_scheduler(world_size=1)
    stored_and_ended(offload)
    now = [100.0]
    offload.leases.clock = lambda: now[0]
    req = request("r1")
    start_load(offload, req)
    now[0] += 3600  # past every lease timeout
    offload.build_metadata(Output({}), FakeKVCacheManager())
    held = offload.held()
    assert held["expired_leases_in_flight"] == ["r1"] and held["active_leases"] == []
    assert held["pinned_host_blocks"] == 4, "the load may still read them"
    offload.on_worker_output(OffloadWorkerMeta(loads_done={"r1": 1}))
    offload.finished(req)
    assert held_kinds(offload.held()) == set()


def test_a_worker_with_a_store_in_flight_holds_the_copy_until_it_is_polled():
    config = OffloadConfig(cpu_bytes_to_use=2**20)
    worker = OffloadWorker(config, FaultInjector(FaultPlan(store_delay_ms=500)), NUM_BLOCKS)
    kv = torch.randn(2, NUM_BLOCKS, 2, 32, 32).to(torch.bfloat16)
    worker.register({"layer.0": kv[0], "layer.1": kv[1]})
    try:
        assert held_kinds(worker.held()) == set()
        worker.start_stores(plan(worker, stores=[BlockTransfer("r1", (1, 2), (0, 1), 5)]))
        held = worker.held()
        assert held["copies_pending"] and held["copy_jobs"] == 1
        deadline = time.monotonic() + 10
        while worker.held()["copies_pending"] and time.monotonic() < deadline:
            worker.poll()
            time.sleep(0.02)
        assert held_kinds(worker.held()) == set()
        assert worker.take_worker_meta().stores_done == {5: 1}
    finally:
        worker.shutdown()


def test_the_cores_answer_for_their_halves_in_a_real_scheduler(tiny_model):
    engine = Engine(tiny_model)
    scheduler_core, worker_core = engine.scheduler.connector.inner, engine.worker.inner
    assert set(scheduler_core.held()) == SCHEDULER_KINDS
    assert set(worker_core.held()) == {"copies_pending", "copy_jobs"}
    seen_by_scheduler, seen_by_worker = [], []
    schedule, wait_for_save = engine.scheduler.schedule, engine.worker.wait_for_save

    def schedule_then_look():
        output = schedule()
        seen_by_scheduler.append(scheduler_core.held())
        return output

    def save_then_look():
        wait_for_save()
        seen_by_worker.append(worker_core.held())

    engine.scheduler.schedule, engine.worker.wait_for_save = schedule_then_look, save_then_look
    prompt = list(range(100, 100 + 6 * BLOCK + 5))
    try:
        engine.add(hma_request("r1", prompt))
        engine.run()
        assert engine.scheduler.reset_prefix_cache()
        assert any(held["copies_pending"] for held in seen_by_worker), "r1's stores copied"
        assert held_kinds(scheduler_core.held()) == set()
        assert held_kinds(worker_core.held()) == set()
        engine.add(hma_request("r2", prompt))
        engine.run()
        assert any(held["active_leases"] for held in seen_by_scheduler), "r2's hit leased"
        assert held_kinds(scheduler_core.held()) == set()
        assert held_kinds(worker_core.held()) == set()
    finally:
        engine.worker.shutdown()
