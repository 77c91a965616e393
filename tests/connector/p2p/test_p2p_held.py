"""What a P2P half still holds (held()): something while a lease, lookup or pull is open, nothing
after it ends."""

from kvscope.connector.p2p.config import P2PConfig
from kvscope.connector.p2p.metadata import P2PWorkerMeta
from kvscope.connector.p2p.scheduler import P2PScheduler
from tests.connector.p2p.test_p2p_protocol import BLOCK, Request, prefilled

SCHEDULER_KINDS = {"held_for_readers", "lookups", "pulling", "pull_timers"}


def held_kinds(held: dict[str, object]) -> set[str]:
    return {kind for kind, value in held.items() if value}


def test_an_idle_scheduler_half_holds_nothing():
    scheduler = P2PScheduler(P2PConfig(), "P", BLOCK)
    assert set(scheduler.held()) == SCHEDULER_KINDS
    assert held_kinds(scheduler.held()) == set()


def test_the_prefill_side_holds_a_finished_requests_blocks_until_read():
    prefill, _ = prefilled()
    assert prefill.held()["held_for_readers"] == ["p-1"]
    prefill.on_worker_output(P2PWorkerMeta(), {"p-1"}, set())
    assert held_kinds(prefill.held()) == set()


def test_the_prefill_side_holds_nothing_after_its_lease_expired():
    prefill, _ = prefilled()
    prefill.on_worker_output(P2PWorkerMeta(leases_expired={"p-1"}), {"p-1"}, set())
    assert held_kinds(prefill.held()) == set()


def test_the_decode_side_holds_a_lookup_then_a_pull_until_every_rank_reported():
    _, params = prefilled()
    decode = P2PScheduler(P2PConfig(), "D", BLOCK)
    request = Request("d-1", 100, dict(params))
    decode.lookup(request, num_computed_tokens=32)
    assert held_kinds(decode.held()) == {"lookups"}
    decode.bind(request, ([10, 11, 12, 13],), 99 - 32)
    held = decode.held()
    assert held_kinds(held) == {"pulling", "pull_timers"}
    assert held["pulling"] == ["d-1"] and held["pull_timers"] == ["d-1"]
    decode.build_metadata()
    decode.on_worker_output(P2PWorkerMeta(), set(), {"d-1"})
    assert held_kinds(decode.held()) == set()


def test_a_lookup_aborted_before_allocation_is_not_held():
    _, params = prefilled()
    decode = P2PScheduler(P2PConfig(), "D", BLOCK)
    request = Request("d-2", 100, dict(params))
    decode.lookup(request, 32)
    decode.finished(request, ([],))
    assert held_kinds(decode.held()) == set()
