"""MLA under tensor parallelism: replicated TP ranks share one host pool, written once.

Two TP ranks' MLA hand-offs (KVCacheConfig.kv_tp_replicas == tp_size, as vLLM computes it) in
one process: the scheduler half and both worker halves size one pool of the whole byte budget
(private pools split over the ranks held half as many blocks, the same ones twice); the leader's
store is the only copy, and the follower loads it back byte-exactly from the shared memory.
"""

import time

import pytest
import torch

pytest.importorskip("vllm")

from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole  # noqa: E402

from kvscope.connector.cpu_offload import replicas  # noqa: E402
from kvscope.connector.cpu_offload.config import OffloadConfig  # noqa: E402
from kvscope.connector.cpu_offload.faults import FaultInjector  # noqa: E402
from kvscope.connector.cpu_offload.metadata import BlockTransfer, OffloadMetadata  # noqa: E402
from kvscope.connector.cpu_offload.replicas import ReplicaGroup  # noqa: E402
from kvscope.connector.cpu_offload.worker import OffloadWorker  # noqa: E402
from tests.gpu_handoff.builder import build_worker_kv_caches  # noqa: E402
from tests.gpu_handoff.stepper import offload_transfer_config, pattern  # noqa: E402

BUDGET = 4 << 20  # cpu_bytes_to_use, server-wide
LAYER = "model.layers.0.self_attn.attn"


def tp_handoff(tiny_model, kind: str = "mla", backend: str = "FLASHMLA", transfer=None):
    """One TP rank's hand-off; the ranks of one engine share its KVTransferConfig (engine id)."""
    return build_worker_kv_caches(
        backend,
        kind,
        128,
        num_blocks=16,
        model=tiny_model,
        tensor_parallel_size=2,
        kv_transfer_config=transfer
        or offload_transfer_config("core", {"cpu_bytes_to_use": BUDGET}),
    )


def scheduler_host_blocks(handoff) -> int:
    core = KVConnectorFactory.create_connector(
        handoff.vllm_config, KVConnectorRole.SCHEDULER, handoff.scheduler_kv_cache_config
    )
    return core.scheduler.pool.num_blocks


def rank_worker(handoff, tp_rank: int) -> OffloadWorker:
    """The worker half of one TP rank, as CpuOffloadCore builds it on that rank."""
    replicas = ReplicaGroup.of(handoff.vllm_config, handoff.kv_cache_config, tp_rank=tp_rank)
    worker = OffloadWorker(
        OffloadConfig(cpu_bytes_to_use=BUDGET),
        FaultInjector(),
        handoff.num_blocks,
        world_size=2,
        replicas=replicas,
    )
    worker.register(handoff.kv_caches)
    return worker


def fill_block(handoff, block_id: int, data) -> None:
    """Writes one KV block (its kernel blocks) of LAYER on one rank."""
    view = handoff.kv_caches[LAYER]
    rows = view[
        block_id * handoff.blocks_per_kv_block : (block_id + 1) * handoff.blocks_per_kv_block
    ]
    rows.view(torch.uint8).copy_(data.view(rows.view(torch.uint8).shape))


def finish(worker: OffloadWorker, metadata: OffloadMetadata, start) -> dict:
    start(metadata)
    for _ in range(200):
        worker.poll()
        meta = worker.take_worker_meta()
        if meta is not None:
            return {**meta.stores_done, **meta.loads_done}
        time.sleep(0.005)
    raise AssertionError("the copy never finished")


def test_replicated_mla_ranks_share_one_pool_of_the_whole_budget_written_once(tiny_model):
    transfer = offload_transfer_config("core", {"cpu_bytes_to_use": BUDGET})
    ranks = [tp_handoff(tiny_model, transfer=transfer) for _ in range(2)]
    assert ranks[0].kv_cache_config.kv_tp_replicas == 2
    page = ranks[0].block_bytes(LAYER, 0).numel()
    whole_budget = BUDGET // (page * len(ranks[0].kv_cache_config.kv_cache_groups[0].layer_names))
    host_blocks = scheduler_host_blocks(ranks[0])
    assert host_blocks == whole_budget, "the pool is split over ranks that hold the same KV"
    leader, follower = rank_worker(ranks[0], 0), rank_worker(ranks[1], 1)
    assert leader.buffer.num_blocks == follower.buffer.num_blocks == host_blocks
    for handoff in ranks:  # the same KV on both ranks, as MLA's replicas compute it
        fill_block(handoff, 3, pattern(page, "r1", 0, 3, 0))
    stored = ranks[0].block_bytes(LAYER, 3)
    store = OffloadMetadata(
        reqs_to_store=[BlockTransfer("r1", (3,), (5,), 1)], num_host_blocks=host_blocks
    )
    assert finish(leader, store, leader.start_stores) == {1: 1}
    assert finish(follower, store, follower.start_stores) == {1: 1}
    assert leader.stats["store_bytes"] > 0 and follower.stats["store_bytes"] == 0
    ranks[1].kv_caches[LAYER].view(torch.uint8).fill_(0)
    load = OffloadMetadata(
        reqs_to_load=[BlockTransfer("r2", (9,), (5,), 2)], num_host_blocks=host_blocks
    )
    assert finish(follower, load, follower.start_loads) == {"r2": 1}
    assert ranks[1].block_bytes(LAYER, 9).equal(stored), "the leader's store, read by rank 1"
    assert ranks[1].block_bytes(LAYER, 3).count_nonzero() == 0, "nothing else written"
    for worker in (leader, follower):
        worker.shutdown()


def test_ranks_that_hold_their_own_kv_keep_private_pools_split_over_the_world(tiny_model):
    handoff = tp_handoff(tiny_model, kind="full", backend="FLASH_ATTN")
    assert handoff.kv_cache_config.kv_tp_replicas == 1
    group = ReplicaGroup.of(handoff.vllm_config, handoff.kv_cache_config, tp_rank=1)
    assert not group.shared and group.host_memory(16, handoff.kv_caches[LAYER].dtype) is None
    page = handoff.block_bytes(LAYER, 0).numel()
    layers = len(handoff.kv_cache_config.kv_cache_groups[0].layer_names)
    assert scheduler_host_blocks(handoff) == BUDGET // 2 // (page * layers)


def test_a_follower_without_its_leader_refuses_rather_than_keep_a_pool_no_one_writes(
    monkeypatch,
):
    monkeypatch.setattr(replicas, "LEADER_WAIT_S", 0.05)
    follower = ReplicaGroup(size=2, leader=False, name="kvscope-offload-test-no-leader")
    with pytest.raises(RuntimeError, match="same kv_transfer_config"):
        follower.host_memory(1024, torch.bfloat16)
    assert not list(replicas.SHARED_MEMORY_DIR.glob(f"{follower.name}*"))


def test_each_pool_a_rank_maps_is_its_own_and_the_same_on_every_rank():
    """Two offload children of one Multi under TP replicas: rank 1's n-th pool is rank 0's."""
    name = f"kvscope-offload-test-pools-{time.monotonic_ns()}"
    leader = ReplicaGroup(size=2, leader=True, name=name, rank=0)
    follower = ReplicaGroup(size=2, leader=False, name=name, rank=1)
    first, second = (leader.host_memory(256, torch.bfloat16) for _ in range(2))
    first.fill_(1)
    second.fill_(2)
    seen = [follower.host_memory(256, torch.bfloat16) for _ in range(2)]
    assert [float(memory.unique()) for memory in seen] == [1.0, 2.0]
