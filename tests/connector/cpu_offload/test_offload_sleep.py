"""vLLM 0.33's sleep mode over the offload connector's worker half (real tensors, the CPU copy
engine): unregister_kv_caches returns only once every copy ended, nothing touches the KV
cache until restore_kv_caches, what was in flight is still reported, and after the cycle the
host pool loads back byte-exactly. vLLM 0.33 maps the KV cache back at the same addresses on
wake and does not call register_kv_caches again (gpu_worker.py: sleep, wake_up, discard)."""

import time

import pytest
import torch
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

from kvscope.connector.cpu_offload.core import CpuOffloadCore
from kvscope.connector.cpu_offload.metadata import BlockTransfer, OffloadMetadata
from tests.connector.hook_orders import (
    BLOCK,
    HEAD_DIM,
    HEADS,
    NUM_LAYERS,
    HookOrder,
    Rig,
    kv_cache_config,
    offload_transfer,
    request,
    vllm_config,
)

NUM_BLOCKS = 16
DELAYS = {"faults": {"store_delay_ms": 200.0, "load_delay_ms": 200.0}}


def worker_core(model, extra=DELAYS) -> tuple[CpuOffloadCore, dict[str, torch.Tensor]]:
    config = vllm_config(model, offload_transfer(**extra), NUM_BLOCKS)
    core = CpuOffloadCore(config, KVConnectorRole.WORKER, kv_cache_config(NUM_BLOCKS))
    memory = torch.randn(NUM_LAYERS, NUM_BLOCKS, HEADS, BLOCK, 2 * HEAD_DIM)
    kv = {f"layer.{i}": m for i, m in enumerate(memory.to(torch.bfloat16))}
    core.register_kv_caches(kv)
    return core, kv


def step(core: CpuOffloadCore, loads=(), stores=(), host_blocks: int | None = None):
    """One step's worker hooks in V1's order; returns get_transfer_results'."""
    host_blocks = host_blocks or core.worker.buffer.num_blocks
    core.bind_connector_metadata(
        OffloadMetadata(list(loads), list(stores), set(), set(), host_blocks)
    )
    core.start_load_kv(None)
    core.wait_for_save()
    results = core.get_transfer_results(set())
    core.clear_connector_metadata()
    return results


def blocks(kv: dict[str, torch.Tensor], block_ids) -> torch.Tensor:
    """The blocks of every layer, [layer, block, ...]."""
    return torch.stack([kv[name][list(block_ids)] for name in sorted(kv)])


def settle(core: CpuOffloadCore) -> None:
    """Lets the copies end, leaving their results to the next poll."""
    deadline = time.monotonic() + 10
    while core.worker.copies.num_pending and time.monotonic() < deadline:
        time.sleep(0.005)
    time.sleep(0.005)  # the CPU engine's thread posts a result right after its copy


def test_sleep_drains_copies_and_the_pool_survives_the_cycle(tiny_model):
    core, kv = worker_core(tiny_model)
    originals = blocks(kv, (1, 2, 3))
    step(core, stores=[BlockTransfer("a", (1, 2), (0, 1), 1)])
    settle(core)
    # A load of what was stored and another store, both held in flight by the fault delays.
    step(
        core,
        loads=[BlockTransfer("b", (5, 6), (0, 1), 7)],
        stores=[BlockTransfer("c", (3,), (2,), 2)],
    )
    assert core.worker.copies.num_pending == 2

    started = time.monotonic()
    core.unregister_kv_caches()
    assert core.worker.copies.num_pending == 0, "a copy outlived unregister_kv_caches"
    assert time.monotonic() - started >= 0.1, "it returned before the delayed copies ended"
    assert torch.equal(blocks(kv, (5, 6)), originals[:, :2]), (
        "the load did not end before the sleep"
    )

    # Asleep, the KV pages are gone (level 1 discards them): nothing may copy to or from them.
    for layer in kv.values():
        layer.fill_(-1.0)
    with pytest.raises(RuntimeError, match="wake the engine"):
        step(core, stores=[BlockTransfer("d", (4,), (3,), 3)])
    core.clear_connector_metadata()
    time.sleep(0.05)
    assert all(bool((layer == -1.0).all()) for layer in kv.values())

    core.restore_kv_caches()
    core.restore_kv_caches()  # idempotent, as vLLM's base class says
    results = step(core)
    assert results.finished_recving == {"b"}, "the load drained by the sleep was not reported"
    meta = core.build_connector_worker_meta()
    assert meta.stores_done == {1: 1, 2: 1} and meta.loads_done == {"b": 1}
    # After the cycle the host pool loads back byte-exactly what was stored before it.
    step(core, loads=[BlockTransfer("e", (8, 9, 10), (0, 1, 2), 8)])
    settle(core)
    assert torch.equal(blocks(kv, (8, 9, 10)), originals)
    core.shutdown()


def test_a_copy_past_the_drain_timeout_is_cancelled_and_its_load_fails(tiny_model):
    core, kv = worker_core(tiny_model, {"faults": {"load_delay_ms": 3000.0}})
    before = blocks(kv, (5,))
    step(core, loads=[BlockTransfer("slow", (5,), (0,), 4)])
    started = time.monotonic()
    core.worker.sleep(timeout_s=0.05)
    assert time.monotonic() - started < 1.0, "the sleep waited out the whole delay"
    assert core.worker.copies.num_pending == 0
    assert torch.equal(blocks(kv, (5,)), before), "a cancelled load wrote its blocks"
    core.restore_kv_caches()
    results = step(core)
    assert results.finished_recving == {"slow"}
    assert core.get_block_ids_with_load_errors() == {5}, "vLLM must recompute the block"
    core.shutdown()


def test_the_connector_users_load_drains_on_sleep_and_says_it_can(tiny_model):
    """CpuOffloadConnector (traced), as vLLM's factory loads it, reaches the core's hooks."""
    transfer = offload_transfer(faults={"store_delay_ms": 200.0})
    cls = KVConnectorFactory.get_connector_class(transfer)
    assert cls.supports_sleep_mode(transfer) is True
    config = vllm_config(tiny_model, transfer, NUM_BLOCKS)
    connector = cls(config, KVConnectorRole.WORKER, kv_cache_config(NUM_BLOCKS))
    memory = torch.randn(NUM_LAYERS, NUM_BLOCKS, HEADS, BLOCK, 2 * HEAD_DIM)
    connector.register_kv_caches({f"layer.{i}": m for i, m in enumerate(memory.bfloat16())})
    core = connector.inner
    step(core, stores=[BlockTransfer("a", (1, 2), (0, 1), 1)])
    connector.unregister_kv_caches()
    assert core.worker.copies.num_pending == 0
    connector.restore_kv_caches()
    assert step(core).finished_sending == set() and core.worker.asleep is False
    connector.shutdown()


def test_a_cache_reset_forgets_the_pool_and_drops_stores_in_flight(tiny_model):
    """What vLLM 0.33's pause before sleep asks (reset_prefix_cache(reset_connector=True)):
    after it no KV computed before it is loaded, even from a store still copying then."""
    rig = Rig(tiny_model, offload_transfer(faults={"store_delay_ms": 300.0}))
    offload = rig.scheduler.connector.inner.scheduler
    prompts = {f"r{i}": [1000 * (i + 1) + t for t in range(3 * BLOCK + 1)] for i in range(2)}
    rig.add(request("r0", prompts["r0"], 2))
    while rig.scheduler.requests or offload.stores.in_flight:
        rig.step(HookOrder.V1)
        time.sleep(0.01)
    assert offload.pool.stats().committed == 3
    rig.add(request("r1", prompts["r1"], 8))
    rig.step(HookOrder.V1)  # r1's prompt blocks are being stored
    assert offload.stores.in_flight
    rig.scheduler.reset_prefix_cache(reset_connector=True)
    assert offload.pool.stats().committed == 0
    while rig.scheduler.requests or offload.stores.in_flight:
        rig.step(HookOrder.V1)
        time.sleep(0.01)
    assert offload.pool.stats().committed == 0, "a store from before the reset was committed"
    for req_id, prompt in prompts.items():
        hit, _ = offload.lookup(request(f"again-{req_id}", prompt, 1), 0)
        assert hit == 0
