"""The offload scheduler half over vLLM's own Request objects: ranks that report in different
steps, repeated lookups, when request_finished may say True, and the pool's size per rank."""

import pytest
from vllm import SamplingParams
from vllm.utils.hashing import sha256_cbor
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.request import Request

from kvscope.connector.common.rank_tally import RankTally
from kvscope.connector.cpu_offload.config import OffloadConfig
from kvscope.connector.cpu_offload.faults import FaultInjector
from kvscope.connector.cpu_offload.host_pool import KVNamespace
from kvscope.connector.cpu_offload.metadata import OffloadWorkerMeta
from kvscope.connector.cpu_offload.scheduler import LoadPhase, OffloadScheduler
from kvscope.traces import names
from kvscope.traces.buffer import call_buffered

BLOCK = 32
NAMESPACE = KVNamespace("tiny", "bfloat16", "cpu", BLOCK, 0, 2, 2, 2, 32)
init_none_hash(sha256_cbor)
HASHER = get_request_block_hasher(BLOCK, sha256_cbor)


def request(req_id: str, num_tokens: int = 4 * BLOCK + 5) -> Request:
    params = SamplingParams(max_tokens=4, temperature=0.0)
    return Request(req_id, list(range(num_tokens)), params, None, block_hasher=HASHER)


class FakeKVCacheManager:
    """What the scheduler half asks vLLM's KVCacheManager: a request's device block ids."""

    def get_block_ids(self, req_id: str) -> tuple[list[int], ...]:
        return (list(range(10, 20)),)


class Output:
    """The part of vLLM's SchedulerOutput the offload scheduler half reads."""

    def __init__(self, num_scheduled_tokens: dict[str, int]) -> None:
        self.num_scheduled_tokens = num_scheduled_tokens
        self.preempted_req_ids: set[str] | None = None


def make_scheduler(world_size: int = 2) -> OffloadScheduler:
    return OffloadScheduler(OffloadConfig(), NAMESPACE, BLOCK, 16, world_size, FaultInjector())


def store_prompt(offload: OffloadScheduler, req: Request) -> list[int]:
    """Plans the stores of a prefill of the whole prompt; returns their reservation ids."""
    offload.lookup(req, 0)
    metadata = offload.build_metadata(
        Output({req.request_id: req.num_prompt_tokens}), FakeKVCacheManager()
    )
    return [store.transfer_id for store in metadata.reqs_to_store]


def test_a_store_commits_when_the_last_rank_reports_a_step_later():
    offload = make_scheduler(world_size=2)
    req = request("r1")
    [store_id] = store_prompt(offload, req)
    offload.on_worker_output(OffloadWorkerMeta(stores_done={store_id: 1}))
    assert offload.stores.in_flight, "committed after one rank of two"
    offload.on_worker_output(None)  # a step in which no rank reported anything
    offload.on_worker_output(OffloadWorkerMeta(stores_done={store_id: 1}))
    assert offload.stores.in_flight == {} and offload.stats.stored_blocks == 4
    assert offload.lookup(request("r2"), 0) == (4 * BLOCK, True)


def test_a_store_one_rank_failed_is_aborted_only_after_every_rank_reported():
    offload = make_scheduler(world_size=2)
    [store_id] = store_prompt(offload, request("r1"))
    offload.on_worker_output(OffloadWorkerMeta(stores_failed={store_id: 1}))
    assert offload.pool.stats().reserved == 4, "freed while the other rank may still write"
    offload.on_worker_output(OffloadWorkerMeta(stores_done={store_id: 1}))
    assert offload.pool.stats().reserved == 0 and offload.stats.stored_blocks == 0
    assert offload.lookup(request("r2"), 0) == (0, False)


def committed(offload: OffloadScheduler) -> None:
    """The whole prompt of 'r0' stored by both ranks."""
    [store_id] = store_prompt(offload, request("r0"))
    offload.on_worker_output(OffloadWorkerMeta(stores_done={store_id: 2}))


def start_load(offload: OffloadScheduler, req: Request) -> None:
    tokens, _ = offload.lookup(req, 0)
    offload.bind(req, list(range(30, 40)), tokens)
    offload.build_metadata(Output({}), FakeKVCacheManager())


def event_names(events) -> list[str]:
    return [name for name, _, _ in events]


def test_a_load_failed_on_one_rank_fails_although_the_other_rank_finished_first():
    offload = make_scheduler(world_size=2)
    committed(offload)
    req = request("r1")
    start_load(offload, req)
    offload.on_worker_output(OffloadWorkerMeta(loads_done={"r1": 1}))
    assert offload.requests["r1"].phase is LoadPhase.LOADING
    _, events = call_buffered(offload.on_worker_output, OffloadWorkerMeta(loads_failed={"r1": 1}))
    assert offload.requests["r1"].phase is LoadPhase.RECOMPUTE
    assert offload.lookup(req, 0) == (0, False), "a failed hit offered again"
    assert offload.stats.failed_loads == 1 and offload.stats.loaded_blocks == 0
    assert offload.stats.failed_load_blocks == 4
    released = [attrs for name, attrs, _ in events if name == names.EVENT_LEASE_RELEASED]
    assert [attrs[names.LEASE_OUTCOME] for attrs in released] == ["failed"]


def test_asking_three_times_takes_one_lease_and_tells_it_once():
    offload = make_scheduler()
    committed(offload)
    req, before = request("r1"), offload.stats.as_dict()
    asked = [call_buffered(offload.lookup, req, 0) for _ in range(3)]
    assert [answer for answer, _ in asked] == [(4 * BLOCK, True)] * 3
    assert len(offload.leases.active()) == 1
    assert offload.stats.lookups - before["lookups"] == 1
    assert offload.stats.hit_tokens - before["hit_tokens"] == 4 * BLOCK
    looked_up_and_leased = [names.EVENT_BLOCK_LOOKED_UP, names.EVENT_LEASE_ACQUIRED]
    assert [event_names(events) for _, events in asked] == [looked_up_and_leased, [], []]


def test_asking_again_refreshes_the_lease():
    offload = make_scheduler()
    committed(offload)
    req = request("r1")
    now = [100.0]
    offload.leases.clock = lambda: now[0]
    offload.lookup(req, 0)
    [first] = offload.leases.active()
    now[0] += 20
    offload.lookup(req, 0)
    [again] = offload.leases.active()
    assert again.lease_id == first.lease_id and again.expires_at == first.expires_at + 20


def test_a_new_question_replaces_the_lease():
    offload = make_scheduler()
    committed(offload)
    req = request("r1")
    offload.lookup(req, 0)
    assert offload.lookup(req, BLOCK) == (3 * BLOCK, True)
    [lease] = offload.leases.active()
    assert len(lease.host_block_ids) == 3


def test_request_finished_says_true_only_for_stores_it_will_report_as_sent():
    offload = make_scheduler(world_size=1)
    storing = request("storing")
    store_prompt(offload, storing)
    assert offload.finished(storing) is True
    assert "storing" in offload.build_metadata(Output({}), FakeKVCacheManager()).reqs_to_flush


def test_a_request_that_ends_while_loading_is_left_to_vllm_to_free():
    # vLLM frees a request that ended in WAITING_FOR_REMOTE_KVS on finished_recving; True
    # here as well would have it freed twice (finished_sending too).
    offload = make_scheduler(world_size=1)
    committed(offload)
    req = request("r1", 7 * BLOCK + 5)  # r0's prompt and three blocks more
    assert store_prompt(offload, req), "stores before a preemption, not acknowledged yet"
    start_load(offload, req)
    assert offload.finished(req) is False
    plan = offload.build_metadata(Output({}), FakeKVCacheManager())
    assert "r1" not in plan.reqs_to_flush
    offload.on_worker_output(OffloadWorkerMeta(loads_done={"r1": 1}))
    assert "r1" in offload.requests, "forgotten while its stores are unacknowledged"
    offload.on_worker_output(
        OffloadWorkerMeta(stores_done=dict.fromkeys(offload.stores.in_flight, 1))
    )
    assert "r1" not in offload.requests and offload.leases.active() == []


@pytest.mark.parametrize(
    ("extra", "world_size", "per_rank"),
    [
        ({"cpu_bytes_to_use": 8 << 30}, 8, 1 << 30),
        ({"cpu_bytes_to_use": 8 << 30}, 1, 8 << 30),
        ({"cpu_bytes_to_use": 8 << 30, "cpu_bytes_to_use_per_rank": 3 << 30}, 8, 3 << 30),
        ({}, 2, 128 << 20),
    ],
)
def test_cpu_bytes_to_use_is_server_wide_as_in_vllm(extra, world_size, per_rank):
    assert OffloadConfig.from_extra_config(extra).bytes_per_rank(world_size) == per_rank


def test_a_bad_per_rank_size_is_refused():
    with pytest.raises(ValueError, match="cpu_bytes_to_use_per_rank"):
        OffloadConfig.from_extra_config({"cpu_bytes_to_use_per_rank": 0})


def test_the_tally_waits_for_every_rank_and_remembers_failures():
    tally: RankTally[str] = RankTally(3)
    assert tally.add({"a": 1}, {}) == []
    assert tally.add({}, {"a": 1}) == []
    assert tally.pending()["a"].failed == 1
    assert sorted(tally.add({"a": 1, "b": 3}, {})) == [("a", False), ("b", True)]
    assert len(tally) == 0
