"""KvscopeMultiConnector under vLLM's hybrid KV cache manager: vLLM's real Scheduler and
KVCacheManager over two KV cache groups (full attention + a 64-token sliding window) with a
Multi of two offload children, its worker half over overlaid KV tensors; and the refusal of a
child that is not SupportsHMA."""

import time

import pytest
from vllm.config import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.base import supports_hma
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import RequestStatus
from vllm.v1.structured_output import StructuredOutputManager

from kvscope.connector.multi.connector import KvscopeMultiConnector
from kvscope.harness import configs
from kvscope.traces import names
from tests.connector.cpu_offload.hma_harness import (
    BLOCK,
    NUM_BLOCKS,
    NUM_LAYERS,
    HmaEngine,
    block_value,
    kv_cache_config,
    overlaid_kv_caches,
    request,
    vllm_config,
)

PROMPT = list(range(100, 100 + 6 * BLOCK + 5))  # 6 full blocks and a partial one
FULL, SWA = 0, 1
FAIL_BAD = {"faults": {"fail_load_req_prefix": "bad"}}


def offload_child(name: str, **extra) -> dict:
    return configs.offload_child(name, **{"cpu_bytes_to_use": 2 << 20, **extra})


def multi_config(model, children: list[dict], policy: str = "recompute"):
    config = vllm_config(model, policy=policy)
    config.kv_transfer_config = KVTransferConfig(**configs.multi_config(*children, policy=policy))
    return config


class MultiEngine(HmaEngine):
    """The harness's engine with the Multi in place of the offload connector."""

    def __init__(self, model, children: list[dict], policy: str = "recompute"):
        config = multi_config(model, children, policy)
        super().__init__(config, kv_cache_config(), overlaid_kv_caches())

    def child(self, index: int):
        """A child's scheduler half (OffloadScheduler)."""
        return self.scheduler.connector.inner.children[index].connector.scheduler

    def run(self, max_steps: int = 40) -> None:
        def idle() -> bool:
            stores = any(self.child(i).stores.in_flight for i in (0, 1))
            return not self.scheduler.has_unfinished_requests() and not stores

        self.run_until(idle, max_steps)

    def settle(self) -> None:
        for child in self.worker.inner.children:
            for job_id in list(child.connector.worker._pending):
                child.connector.worker.copies.wait(job_id)
        time.sleep(0.01)  # the CPU engine's thread posts the result right after the copy

    def step_until_loaded(self, req_id: str) -> None:
        for _ in range(10):
            self.step()
            if req_id in (self.outputs[-1].finished_recving or ()):
                return
        raise AssertionError(f"{req_id} never finished its load")

    def assert_loaded(self, req_id: str) -> None:
        """The whole prefix of the full group and the window of the sliding one, byte-exact."""
        full_ids, swa_ids = self.block_ids(req_id)
        for index in range(6):
            for layer in range(NUM_LAYERS):
                assert self.read(FULL, full_ids[index], layer) == block_value(FULL, index, layer)
        for index in (4, 5):  # the 64-token window before the hit's end at block 6
            for layer in range(NUM_LAYERS):
                assert self.read(SWA, swa_ids[index], layer) == block_value(SWA, index, layer)

    def assert_all_freed(self) -> None:
        for index in (0, 1):
            offload = self.child(index)
            assert offload.requests == {} and offload.stores.in_flight == {}
            assert offload.leases.active() == [] and offload.pool.stats().pinned == 0
        multi = self.scheduler.connector.inner.scheduler
        assert multi.loads == {} and multi.serving == {}
        assert (
            self.worker.inner.worker.routes == {} and self.worker.inner.worker.loads_held_back == {}
        )
        assert self.scheduler.requests == {}
        block_pool = self.scheduler.kv_cache_manager.block_pool
        assert block_pool.get_num_free_blocks() == NUM_BLOCKS - 1


def stored_engine(model, first: dict, second: dict, policy: str = "recompute") -> MultiEngine:
    """Both children hold r1's prompt (the Multi saves to all), vLLM's prefix cache emptied."""
    children = [offload_child("first", **first), offload_child("second", **second)]
    engine = MultiEngine(model, children, policy)
    engine.add(request("r1", PROMPT))
    engine.run()
    assert engine.scheduler.reset_prefix_cache()
    for index in (0, 1):
        assert engine.child(index).stats["stored_blocks"] == 2 * 6, "six blocks of each group"
    return engine


def events(spans, name: str, req_id: str) -> list[dict]:
    """One request's events (ids are unique per test: an earlier test's spans may export late)."""
    found = [dict(e.attributes) for s in spans() for e in s.events if e.name == name]
    return [e for e in found if e.get(names.REQUEST_ID) == req_id]


def test_the_multi_is_supports_hma_as_vllm_asks(tiny_model):
    assert supports_hma(KvscopeMultiConnector)
    config = multi_config(tiny_model, [offload_child("a")])
    assert KVConnectorFactory.supports_hma_config(config.kv_transfer_config)


def test_a_hit_is_served_by_the_first_child_in_both_groups(tiny_model, spans):
    engine = stored_engine(tiny_model, {}, {})
    engine.add(request("hit", PROMPT))
    engine.step_until_loaded("hit")
    engine.assert_loaded("hit")
    assert engine.child(0).stats["loaded_blocks"] == 6 + 2
    assert engine.child(1).stats["loaded_blocks"] == 0
    [routed] = events(spans, "kvscope.multi.load_routed", "hit")
    full_ids, swa_ids = engine.block_ids("hit")
    assert routed[names.CONNECTOR_CHILD] == "first"
    assert list(routed[names.BLOCK_IDS]) == full_ids[:6] + swa_ids[4:6]
    assert list(routed[names.KV_CACHE_GROUP_IDS]) == [FULL] * 6 + [SWA] * 2
    engine.run()
    engine.assert_all_freed()


def test_a_failed_load_falls_back_to_the_second_child_in_every_group(tiny_model, spans):
    engine = stored_engine(tiny_model, FAIL_BAD, {})
    engine.add(bad := request("bad-fallback", PROMPT))
    engine.step_until_loaded("bad-fallback")
    output = engine.outputs[-1]
    assert not output.failed_recving and not output.invalid_block_ids
    engine.assert_loaded("bad-fallback")
    assert engine.child(1).stats["loaded_blocks"] == 6 + 2
    [failed] = [
        e
        for e in events(spans, names.EVENT_LOAD_FAILED, "bad-fallback")
        if e.get("kvscope.multi.fallback_child")
    ]
    assert failed[names.FAILURE_OUTCOME] == "served_by_fallback"
    assert failed["kvscope.multi.blocks_not_in_fallback"] == 0
    routes = events(spans, "kvscope.multi.load_routed", "bad-fallback")
    assert [r[names.CONNECTOR_CHILD] for r in routes] == ["first", "second"]
    assert list(routes[1][names.KV_CACHE_GROUP_IDS]) == [FULL] * 6 + [SWA] * 2
    engine.step()
    assert bad.num_computed_tokens >= 6 * BLOCK, "the fallback's blocks count as computed"
    engine.run()
    engine.assert_all_freed()


@pytest.mark.parametrize("policy", ["recompute", "fail"])
def test_a_load_nobody_can_serve_is_reported_by_request(tiny_model, policy):
    engine = stored_engine(tiny_model, FAIL_BAD, FAIL_BAD, policy)
    engine.add(bad := request("bad-2", PROMPT))
    engine.step_until_loaded("bad-2")
    output = engine.outputs[-1]
    assert output.failed_recving == {"bad-2"}
    assert output.invalid_block_ids == set(), "block ids are per group: vLLM refuses them"
    engine.run()
    if policy == "recompute":
        assert bad.status is RequestStatus.FINISHED_LENGTH_CAPPED
    else:
        assert bad.status is RequestStatus.FINISHED_ERROR
    engine.assert_all_freed()


def test_a_shorter_fallback_is_no_fallback_with_two_groups(tiny_model, spans):
    """vLLM recomputes a multi-group failure whole: a fallback without every block is none."""
    engine = stored_engine(tiny_model, FAIL_BAD, {})
    second = engine.child(1)
    [swa_key] = second.groups.block_keys(
        second.namespace, request("x", PROMPT).block_hashes[5:6], SWA
    )
    assert second.pool.evict(swa_key), "the second child's hit now ends at block 5"
    engine.add(request("bad-short", PROMPT))
    engine.step_until_loaded("bad-short")
    assert engine.outputs[-1].failed_recving == {"bad-short"}
    assert engine.child(1).stats["loaded_blocks"] == 0
    outcomes = {
        e[names.FAILURE_OUTCOME]
        for e in events(spans, names.EVENT_LOAD_FAILED, "bad-short")
        if names.CONNECTOR_CHILD in e
    }
    assert outcomes == {"recomputed"}
    engine.run()
    engine.assert_all_freed()


def example_child(tmp_path) -> dict:
    return configs.child("example", "ExampleConnector", None, shared_storage_path=str(tmp_path))


def traced_example(tmp_path) -> dict:
    return configs.traced_child("ExampleConnector", "example", shared_storage_path=str(tmp_path))


def vllm_multi_over_example(tmp_path) -> dict:
    """vLLM's own MultiConnector, SupportsHMA only when all of its children are."""
    example = {
        "kv_connector": "ExampleConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"shared_storage_path": str(tmp_path)},
    }
    return {
        "name": "example",
        "kv_connector": "MultiConnector",
        "kv_connector_extra_config": {"connectors": [example]},
    }


@pytest.mark.parametrize(
    ("make_child", "class_name"),
    [
        (example_child, "ExampleConnector"),
        (traced_example, "ExampleConnector"),
        (vllm_multi_over_example, "MultiConnector"),
    ],
)
def test_a_child_without_hma_is_refused_by_name_with_two_groups(
    tiny_model, tmp_path, make_child, class_name
):
    config = multi_config(tiny_model, [offload_child("offload"), make_child(tmp_path)])
    with pytest.raises(ValueError) as refused:
        Scheduler(config, kv_cache_config(), StructuredOutputManager(config), block_size=BLOCK)
    message = str(refused.value)
    assert f"child example ({class_name}) does not support HMA" in message
    assert "2 KV cache groups" in message and "--disable-hybrid-kv-cache-manager" in message
    assert "offload" not in message.split("support HMA")[0]


def test_with_one_group_a_child_without_hma_gets_request_finished(tiny_model, tmp_path, spans):
    config = multi_config(tiny_model, [offload_child("offload"), example_child(tmp_path)])
    scheduler = Scheduler(
        config, kv_cache_config(("full",)), StructuredOutputManager(config), block_size=BLOCK
    )
    finished = scheduler.connector.request_finished_all_groups(request("one", PROMPT), ([1, 2],))
    assert finished == (False, None)
    hooks = [
        s
        for s in spans()
        if s.attributes.get(names.HOOK) == "request_finished"
        and s.attributes.get(names.REQUEST_ID) == "one"
    ]
    counts = {
        s.attributes.get(names.CONNECTOR_CHILD): s.attributes.get(names.KV_CACHE_GROUP_COUNT)
        for s in hooks
    }
    assert counts == {None: 1, "offload": 1, "example": 1}, "the Multi's span and each child's"
