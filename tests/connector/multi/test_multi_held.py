"""What the Multi's own halves still hold (held()): something while a load is routed, held back
or part-reported by the ranks, or a save is owed by a second child; nothing after it ends."""

from types import SimpleNamespace

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.v1.outputs import KVConnectorOutput

from kvscope.connector.multi.connector import KvscopeMultiConnector
from kvscope.connector.multi.metadata import LoadEnd, LoadRoute, MultiMetadata, MultiWorkerMeta
from tests.connector.cpu_offload.hma_harness import request
from tests.connector.multi.test_child_config import outer
from tests.connector.multi.test_multi_hma import PROMPT, stored_engine
from tests.connector.multi.test_multi_plumbing import child

SCHEDULER_KINDS = {"loads", "serving", "loads_reported_by_some_ranks"}
WORKER_KINDS = {"routes", "failed_blocks", "extra_saves", "loads_held_back"}


def held_kinds(held: dict[str, object]) -> set[str]:
    return {kind for kind, value in held.items() if value}


def two_rank_multi(role: KVConnectorRole):
    """A Multi core of one recording child at TP x PP = 2, as one of its ranks builds it."""
    vllm_config = SimpleNamespace(
        kv_transfer_config=outer(child("only"), role="kv_both"),
        cache_config=SimpleNamespace(block_size=32),
        parallel_config=SimpleNamespace(world_size=2),
    )
    return KvscopeMultiConnector(vllm_config, role, None).inner


def test_idle_multi_halves_hold_nothing():
    for role, kinds in (
        (KVConnectorRole.SCHEDULER, SCHEDULER_KINDS),
        (KVConnectorRole.WORKER, WORKER_KINDS),
    ):
        multi = two_rank_multi(role)
        assert set(multi.held()) == kinds and held_kinds(multi.held()) == set()


def test_a_load_one_rank_reported_is_held_until_the_other_does():
    multi = two_rank_multi(KVConnectorRole.SCHEDULER)

    def rank_reports(end: LoadEnd) -> None:
        meta = MultiWorkerMeta((None,), {"r1": end}, ({},))
        multi.update_connector_output(KVConnectorOutput(kv_connector_worker_meta=meta))

    rank_reports(LoadEnd(0, ranks_ok=1))
    assert multi.held()["loads_reported_by_some_ranks"] == ["r1"]
    rank_reports(LoadEnd(0, ranks_ok=1))
    assert held_kinds(multi.held()) == set()


def test_a_routed_load_is_held_back_until_every_rank_loaded_it():
    multi = two_rank_multi(KVConnectorRole.WORKER)
    only = multi.children[0].connector
    multi.bind_connector_metadata(MultiMetadata((None,), {"r1": LoadRoute(0, ((3, 4),))}))
    assert multi.held()["routes"] == ["r1"]
    only.load_errors = {4}  # the child says so before it reports the load finished
    multi.get_transfer_results(set())
    assert held_kinds(multi.held()) == {"routes", "failed_blocks"}
    assert multi.held()["failed_blocks"] == {"r1": [(0, 4)]}
    only.finished = (set(), {"r1"})
    multi.get_transfer_results(set())
    assert held_kinds(multi.held()) == set(), "a failed load goes to the scheduler at once"

    multi.bind_connector_metadata(MultiMetadata((None,), {"r2": LoadRoute(0, ((5,),))}))
    only.finished = (set(), {"r2"})
    results = multi.get_transfer_results(set())
    assert "r2" not in results.finished_recving
    assert held_kinds(multi.held()) == {"loads_held_back"}, "the other rank may still fail"
    multi.bind_connector_metadata(MultiMetadata((None,), reqs_to_release={"r2"}))
    assert multi.get_transfer_results(set()).finished_recving == {"r2"}
    assert held_kinds(multi.held()) == set()


def test_a_save_owed_by_a_second_child_is_held_until_it_ends():
    multi = two_rank_multi(KVConnectorRole.WORKER)
    only = multi.children[0].connector
    multi.bind_connector_metadata(MultiMetadata((None,), extra_async_saves={"r1": 1}))
    assert multi.held()["extra_saves"] == {"r1": 1}
    only.finished = ({"r1"}, set())
    assert multi.get_transfer_results(set()).finished_sending == set()
    assert held_kinds(multi.held()) == set()


def test_a_multi_engine_holds_a_hit_while_it_loads_and_nothing_after(tiny_model, monkeypatch):
    """vLLM's real Scheduler over two offload children (tests/connector/multi/test_multi_hma);
    held() is read as each step's load starts, and after each step."""
    engine = stored_engine(tiny_model, {}, {})
    scheduler_core = engine.scheduler.connector.inner
    worker_core = engine.worker.inner
    seen = {"scheduler": set(), "worker": set()}

    def record() -> bool:
        """Whether both halves hold nothing now."""
        seen["scheduler"] |= held_kinds(scheduler_core.held())
        seen["worker"] |= held_kinds(worker_core.held())
        return not held_kinds(scheduler_core.held()) and not held_kinds(worker_core.held())

    start_load_kv = engine.worker.start_load_kv

    def start_and_record(*args, **kwargs):
        record()
        return start_load_kv(*args, **kwargs)

    monkeypatch.setattr(engine.worker, "start_load_kv", start_and_record)
    engine.add(request("hit", PROMPT))
    for _ in range(40):
        engine.step()
        if record() and not engine.scheduler.has_unfinished_requests():
            break
    assert seen == {"scheduler": {"loads", "serving"}, "worker": {"routes"}}
    assert held_kinds(scheduler_core.held()) == set()
    assert held_kinds(worker_core.held()) == set()
    engine.run()
    engine.assert_all_freed()
