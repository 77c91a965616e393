"""The deferred-finalize order (a speculator: get_transfer_results before wait_for_save) holds
no finished request's blocks longer than model runner V1's own order does, for the offload
connector, kvscope's Multi over two offload children and TracedConnector over the offload."""

import pytest

from tests.connector.hook_orders import (
    BLOCK,
    HookOrder,
    Rig,
    multi_transfer,
    offload_transfer,
    request,
    traced_transfer,
    wait_for_copies,
)

TRANSFERS = {"offload": offload_transfer, "multi": multi_transfer, "traced": traced_transfer}
# A prompt of 3 blocks and a token; the 32nd output token's step fills block 3, so the last
# step plans a store, still copying when the request finishes.
MAX_TOKENS = 32
STORE_DELAY = {"faults": {"store_delay_ms": 20.0}}
"""Stores end after the step that submits them polls, and before the next: as on CUDA."""


def steps_blocks_held(model, transfer, order: HookOrder) -> dict[str, int]:
    """For each request: steps from the one that finished it to the one that freed its blocks."""
    rig = Rig(model, transfer(**STORE_DELAY))
    for i in range(3):
        rig.add(request(f"r{i}", [1000 * (i + 1) + t for t in range(3 * BLOCK + 1)], MAX_TOKENS))
    finished_at: dict[str, int] = {}
    freed_at: dict[str, int] = {}
    for _ in range(MAX_TOKENS + 6):
        rig.step(order)
        wait_for_copies(rig.worker)
        for req_id, req in list(rig.scheduler.requests.items()):
            if req.is_finished() and req_id not in finished_at:
                finished_at[req_id] = rig.steps
        for req_id in finished_at.keys() - rig.scheduler.requests.keys() - freed_at.keys():
            freed_at[req_id] = rig.steps
    assert set(freed_at) == {"r0", "r1", "r2"}, f"blocks still held: {rig.scheduler.requests}"
    # A request freed in the step it finished never shows as finished-and-held above.
    return {
        req_id: freed_at[req_id] - finished_at.get(req_id, freed_at[req_id]) for req_id in freed_at
    }


@pytest.mark.parametrize("connector", sorted(TRANSFERS))
def test_deferred_finalize_frees_blocks_when_v1_order_does(tiny_model, connector):
    v1 = steps_blocks_held(tiny_model, TRANSFERS[connector], HookOrder.V1)
    deferred = steps_blocks_held(tiny_model, TRANSFERS[connector], HookOrder.DEFERRED)
    v2 = steps_blocks_held(tiny_model, TRANSFERS[connector], HookOrder.V2)
    assert v1 == {"r0": 1, "r1": 1, "r2": 1}, "the last store was not in flight at the finish"
    assert deferred == v1, "the deferred order holds finished requests' blocks a step longer"
    assert v2 == v1
