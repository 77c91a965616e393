"""The offload connector under vLLM's hybrid KV cache manager: vLLM's real Scheduler and
KVCacheManager over two KV cache groups (full attention + a 64-token sliding window), the
connector's scheduler half inside it and its worker half over overlaid KV tensors."""

import pytest
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole, supports_hma
from vllm.v1.request import RequestStatus

from kvscope.connector.cpu_offload.connector import CpuOffloadConnector
from kvscope.connector.cpu_offload.groups import KVGroups
from kvscope.connector.cpu_offload.request_state import LoadPhase
from kvscope.connector.traced import TracedConnector
from kvscope.traces import names
from tests.connector.cpu_offload.hma_harness import (
    BLOCK,
    NUM_BLOCKS,
    NUM_LAYERS,
    Engine,
    block_value,
    kv_cache_config,
    request,
    vllm_config,
)

PROMPT = list(range(100, 100 + 6 * BLOCK + 5))  # 6 full blocks and a partial one
FULL, SWA = 0, 1


def stored_engine(tiny_model, extra=None, policy: str = "recompute") -> Engine:
    """An engine whose host pool holds r1's prompt, with vLLM's own prefix cache emptied."""
    engine = Engine(tiny_model, extra, policy=policy)
    engine.add(request("r1", PROMPT))
    engine.run()
    assert engine.scheduler.reset_prefix_cache()
    return engine


def step_until_loaded(engine: Engine, req_id: str) -> None:
    for _ in range(10):
        engine.step()
        if req_id in (engine.outputs[-1].finished_recving or ()):
            return
    raise AssertionError(f"{req_id} never finished its load")


def test_the_connectors_are_supports_hma():
    assert supports_hma(CpuOffloadConnector) and supports_hma(TracedConnector)


def test_every_group_is_stored_under_its_own_keys(tiny_model):
    engine = stored_engine(tiny_model)
    offload = engine.offload
    assert offload.stats.stored_blocks == 2 * 6, "six full blocks in each of two groups"
    hashes = engine.scheduler.requests.get("r1") or request("x", PROMPT)
    for group in (FULL, SWA):
        keys = offload.groups.block_keys(offload.namespace, hashes.block_hashes[:6], group)
        assert len(offload.pool.lookup(keys)) == 6
    full_keys = offload.groups.block_keys(offload.namespace, hashes.block_hashes[:1], FULL)
    swa_keys = offload.groups.block_keys(offload.namespace, hashes.block_hashes[:1], SWA)
    assert full_keys != swa_keys, "one block hash, two groups: two host blocks"


def test_a_hit_loads_the_full_prefix_and_only_the_window_of_the_sliding_group(tiny_model, spans):
    engine = stored_engine(tiny_model)
    engine.add(request("r2", PROMPT))
    step_until_loaded(engine, "r2")
    full_ids, swa_ids = engine.block_ids("r2")
    for index in range(6):
        for layer in range(NUM_LAYERS):
            assert engine.read(FULL, full_ids[index], layer) == block_value(FULL, index, layer)
    null = engine.scheduler.kv_cache_manager.block_pool.null_block.block_id
    for index in (4, 5):  # the 64-token window before the hit's end at block 6
        assert swa_ids[index] != null
        for layer in range(NUM_LAYERS):
            assert engine.read(SWA, swa_ids[index], layer) == block_value(SWA, index, layer)
    assert engine.offload.stats.loaded_blocks == 6 + 2
    acquired = [
        e
        for span in spans()
        for e in span.events
        if e.name == names.EVENT_LEASE_ACQUIRED and e.attributes[names.LEASE_HOLDER] == "r2"
    ]
    assert list(acquired[0].attributes[names.KV_CACHE_GROUP_IDS]) == [0, 0, 0, 0, 0, 1, 0, 1]
    [loaded] = [e for span in spans() for e in span.events if e.name == names.EVENT_BLOCK_LOADED]
    assert list(loaded.attributes[names.KV_CACHE_GROUP_IDS]) == [0, 0, 0, 0, 0, 1, 0, 1]
    assert list(loaded.attributes[names.BLOCK_IDS])[5] == swa_ids[4]
    engine.run()
    assert engine.scheduler.requests == {}


def test_a_hit_ends_where_the_sliding_window_group_has_its_window(tiny_model):
    engine = stored_engine(tiny_model)
    offload = engine.offload
    hashes = request("x", PROMPT).block_hashes
    swa_keys = offload.groups.block_keys(offload.namespace, hashes[:6], SWA)
    for key in swa_keys[:4]:  # blocks no hit ending at block 6 attends to
        assert offload.pool.evict(key)
    assert offload.lookup(request("a", PROMPT), 0) == (6 * BLOCK, True)
    offload.finished(request("a", PROMPT))
    assert offload.pool.evict(swa_keys[5])
    # Ending at 6 needs window blocks 4-5, at 5 blocks 3-4: the longest hit is block 4 (0-3
    # of the full group; the window 2-3 of the sliding one is gone too): none left.
    assert offload.lookup(request("b", PROMPT), 0) == (0, False)
    offload.finished(request("b", PROMPT))


@pytest.mark.parametrize("policy", ["recompute", "fail"])
def test_a_failed_load_is_reported_by_request(tiny_model, policy):
    faults = {"faults": {"fail_load_req_prefix": "bad"}}
    engine = stored_engine(tiny_model, faults, policy)
    engine.add(bad := request("bad-2", PROMPT))
    step_until_loaded(engine, "bad-2")
    output = engine.outputs[-1]
    assert output.failed_recving == {"bad-2"}
    assert output.invalid_block_ids == set(), "block ids are per group: vLLM refuses them"
    assert engine.offload.pool.stats().pinned == 0, "the failed load's lease was released"
    if policy == "recompute":
        assert engine.offload.requests["bad-2"].phase is LoadPhase.RECOMPUTE
        assert bad.num_computed_tokens == 0 and not bad.is_finished()
    else:
        assert bad.status is RequestStatus.FINISHED_ERROR
    engine.run()
    assert engine.offload.requests == {} and engine.scheduler.requests == {}
    assert engine.scheduler.kv_cache_manager.block_pool.get_num_free_blocks() == NUM_BLOCKS - 1


def test_everything_is_freed_after_the_requests_end(tiny_model):
    engine = stored_engine(tiny_model)
    engine.add(request("r2", PROMPT + [1, 2, 3]))
    engine.add(request("r3", PROMPT[: BLOCK * 3] + list(range(5000, 5000 + 3 * BLOCK))))
    engine.run()
    offload = engine.offload
    assert (
        offload.requests == {} and offload.stores.in_flight == {} and offload.leases.active() == []
    )
    assert offload.pool.stats().pinned == 0 and offload.pool.stats().reserved == 0
    block_pool = engine.scheduler.kv_cache_manager.block_pool
    # Sliding-window blocks held for stores went back: every block but the null one is free.
    assert block_pool.get_num_free_blocks() == NUM_BLOCKS - 1


def test_a_request_runs_on_after_its_two_group_load(tiny_model):
    engine = stored_engine(tiny_model)
    engine.add(request("r2", PROMPT, max_tokens=4))
    step_until_loaded(engine, "r2")
    engine.step()
    assert engine.scheduler.requests["r2"].status is RequestStatus.RUNNING
    engine.run()
    assert engine.offload.requests == {}


def test_one_group_keeps_the_keys_it_had_before_hma():
    groups = KVGroups.of(kv_cache_config(("full",)))
    assert not groups.multi and groups.groups[0].window_blocks is None
    two = KVGroups.of(kv_cache_config())
    assert two.multi and two.groups[1].window_blocks == 2


def test_traced_connector_over_a_connector_without_hma_refuses_two_groups(tiny_model, tmp_path):
    config = vllm_config(tiny_model)
    config.kv_transfer_config.kv_connector = "TracedConnector"
    config.kv_transfer_config.kv_connector_module_path = "kvscope.connector.traced"
    config.kv_transfer_config.kv_connector_extra_config = {
        "connector": "ExampleConnector",
        "shared_storage_path": str(tmp_path),
    }
    TracedConnector(config, KVConnectorRole.SCHEDULER, kv_cache_config(("full",)))
    with pytest.raises(ValueError, match="--disable-hybrid-kv-cache-manager"):
        TracedConnector(config, KVConnectorRole.SCHEDULER, kv_cache_config())
