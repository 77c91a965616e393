"""vLLM 0.34's `--max-num-inflight-kv-loads` with the offload connector, on vLLM's real Scheduler.

With the option set, vLLM asks the connector `may_load_async(request)` when a request arrives
(`Scheduler._enqueue_waiting_request`): True puts it in `async_kv_waiting`, whose loads start
while every running slot is taken, so the KV is there when a slot frees. The offload connector
answers True for a request whose last loadable prompt block its pool holds: such a request loads
while another holds the only slot, then runs over the right KV.
"""

import pytest
from vllm.config import SchedulerConfig
from vllm.v1.request import RequestStatus

from tests.connector.hook_orders import (
    BLOCK,
    HookOrder,
    Rig,
    offload_transfer,
    request,
    wait_for_copies,
)

if "max_num_inflight_kv_loads" not in SchedulerConfig.__dataclass_fields__:
    pytest.skip(
        "this vLLM has no max_num_inflight_kv_loads (added in 0.34)", allow_module_level=True
    )

PROMPT = [7000 + t for t in range(3 * BLOCK + 1)]
PROMPT_BLOCKS = 3


def step(rig: Rig):
    output = rig.step(HookOrder.V2)
    wait_for_copies(rig.worker)
    return output


def run_until(rig: Rig, done, max_steps: int = 200) -> None:
    for _ in range(max_steps):
        if done():
            return
        step(rig)
    raise AssertionError("the scheduler did not get there")


@pytest.fixture
def rig(tiny_model) -> Rig:
    """One running slot, async loads allowed; PROMPT's blocks stored in the host pool and gone
    from vLLM's prefix cache."""
    rig = Rig(tiny_model, offload_transfer(), max_num_seqs=1, max_num_inflight_kv_loads=2)
    rig.add(request("stored", PROMPT, 1))
    run_until(rig, lambda: not rig.scheduler.requests)
    step(rig)  # the last store's result
    assert rig.scheduler.reset_prefix_cache()
    return rig


def test_a_request_the_pool_holds_waits_to_load_asynchronously(rig):
    rig.add(hit := request("hit", PROMPT, 2))
    rig.add(miss := request("miss", [9000 + t for t in range(3 * BLOCK + 1)], 2))
    assert hit in list(rig.scheduler.async_kv_waiting)
    assert miss in list(rig.scheduler.waiting) and miss not in list(rig.scheduler.async_kv_waiting)


def test_a_hit_loads_while_the_only_slot_is_taken_then_runs_over_the_right_kv(rig):
    rig.add(request("busy", [8000 + t for t in range(BLOCK + 1)], 24))
    step(rig)
    assert [r.request_id for r in rig.scheduler.running] == ["busy"]
    rig.add(hit := request("hit", PROMPT, 2))
    run_until(rig, lambda: hit.status is not RequestStatus.WAITING)
    assert hit.status is RequestStatus.WAITING_FOR_REMOTE_KVS, "the load did not start"
    assert rig.scheduler.requests["busy"].status is RequestStatus.RUNNING, "the slot was taken"
    while (scheduled := step(rig).num_scheduled_tokens.get("hit")) is None:
        assert rig.steps < 200, "the loaded request never ran"
    assert scheduled == len(PROMPT) - PROMPT_BLOCKS * BLOCK, "it computed what it had loaded"
    assert rig.holds_right_kv("hit", PROMPT_BLOCKS)
