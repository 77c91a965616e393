"""Model runner V2 zeroes a step's new blocks (update_requests) before pre_forward calls
handle_preemptions: a block a preempted request's store still reads must not be among them.
vLLM's Scheduler (told its KV needs zeroing, as for mixed-precision KV) and V2's own
ActiveKVConnector over the offload connector, with stores held in flight by fault injection.
The stores' references on their blocks protect them, so handle_preemptions waits for none (on
CUDA a wait drains the forward queued before the store)."""

import time

from tests.connector.hook_orders import (
    BLOCK,
    HookOrder,
    Rig,
    offload_transfer,
    offload_workers,
    request,
)

NUM_BLOCKS = 13  # 12 and the null block: 4 requests of 4 blocks growing to 6 cannot all fit
STORE_DELAY = {"faults": {"store_delay_ms": 300.0}}  # each store outlasts many steps


class V2Zeroing:
    """What V2's update_requests does to new blocks, after noting which a store still reads."""

    def __init__(self, rig: Rig) -> None:
        self.rig = rig
        self.zeroed_while_stored: list[set[int]] = []
        self.preempted_while_storing: set[str] = set()

    def __call__(self, output) -> None:
        in_flight: dict[str, set[int]] = {}
        for worker in offload_workers(self.rig.worker):
            in_flight.update(worker.stores_in_flight())
        self.preempted_while_storing |= set(output.preempted_req_ids or ()) & set(in_flight)
        zeroed = set(output.new_block_ids_to_zero or ())
        reading = set().union(*in_flight.values()) if in_flight else set()
        if zeroed & reading:
            self.zeroed_while_stored.append(zeroed & reading)
        for kv in self.rig.kv_caches.values():
            kv[sorted(zeroed)] = 0  # KVBlockZeroer.zero_block_ids, without its Triton kernel


class LoadedKV:
    """Before V2 zeroes a step's new blocks, notes whether each reloaded request's hit holds
    the KV its content was computed with (the load ended: the request is scheduled)."""

    def __init__(self, rig: Rig, num_blocks: int) -> None:
        self.rig, self.num_blocks = rig, num_blocks
        self.right: dict[str, bool] = {}

    def __call__(self, output) -> None:
        for req_id in output.num_scheduled_tokens:
            req = self.rig.scheduler.requests[req_id]
            if req_id not in self.right and req.num_computed_tokens >= self.num_blocks * BLOCK:
                self.right[req_id] = self.rig.holds_right_kv(req_id, self.num_blocks)
        V2Zeroing(self.rig)(output)


def count_store_waits(rig: Rig) -> list[int]:
    """The copy jobs the worker waits for from now on (handle_preemptions' host syncs)."""
    waits: list[int] = []
    for worker in offload_workers(rig.worker):
        wait = worker.copies.wait
        worker.copies.wait = lambda job_id, *args, wait=wait: (
            waits.append(job_id) or wait(job_id, *args)
        )
    return waits


def run_until_idle(rig: Rig, zeroing, timeout_s: float = 60) -> None:
    """Steps until no request is left and every store reported (its held blocks freed)."""
    offload = rig.scheduler.connector.inner.scheduler
    deadline = time.monotonic() + timeout_s
    while rig.scheduler.has_unfinished_requests() or offload.stores.in_flight:
        assert time.monotonic() < deadline, "requests or stores never finished"
        rig.step(HookOrder.V2, before_worker=zeroing)
        time.sleep(0.002)


def test_v2_never_zeroes_a_block_a_preempted_requests_store_reads(tiny_model):
    rig = Rig(tiny_model, offload_transfer(**STORE_DELAY), NUM_BLOCKS, zeroing=True)
    requests = [
        request(f"r{i}", [1000 * (i + 1) + t for t in range(3 * BLOCK + 1)], 2 * BLOCK)
        for i in range(4)
    ]
    for req in requests:
        rig.add(req)
    zeroing = V2Zeroing(rig)
    waits = count_store_waits(rig)
    run_until_idle(rig, zeroing)
    assert zeroing.preempted_while_storing, "no request was preempted with a store in flight"
    assert zeroing.zeroed_while_stored == []
    assert waits == [], "handle_preemptions waited for stores that hold their blocks"
    # What a user sees: the same tokens again, served from the host pool, hold the right KV.
    assert rig.scheduler.reset_prefix_cache(), "vLLM still holds blocks: nothing left to load"
    stored = (3 * BLOCK + 2 * BLOCK) // BLOCK  # the last output token is never computed
    loaded = LoadedKV(rig, stored)
    for req in requests:
        rig.add(request(f"again-{req.request_id}", req.all_token_ids[: stored * BLOCK + 1], 1))
    run_until_idle(rig, loaded)
    assert loaded.right == {f"again-r{i}": True for i in range(4)}
