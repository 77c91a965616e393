"""What a P2P half still holds (held()): something while a lease, lookup, handshake or pull is
open, nothing after it ends; over real NIXL agents and vLLM's real Schedulers."""

import threading
import time

import pytest

from kvscope.connector.p2p.config import P2PConfig
from kvscope.connector.p2p.metadata import (
    BlockPull,
    HeldBlocks,
    P2PMetadata,
    P2PWorkerMeta,
)
from kvscope.connector.p2p.params import RemotePrefill
from kvscope.connector.p2p.scheduler import P2PScheduler
from kvscope.connector.p2p.worker import P2PWorker
from kvscope.harness.engine import free_port
from kvscope.harness.nixl_peer import FakeKVShape, make_fake_kv_caches
from tests.connector.p2p.hma_pair import Side, pump, recved
from tests.connector.p2p.test_p2p_hma import request as hma_request
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


# --- worker halves over real NIXL agents and side channels ------------------------------------

WORKER_KINDS = {"reads_in_flight", "handshakes_in_flight", "lender_held"}
SHAPE = FakeKVShape(num_layers=2, num_blocks=8, num_kv_heads=2, block_size=32, head_dim=32)


@pytest.fixture
def workers():
    """A prefill worker half serving its side channel and a decode worker half, unconnected."""
    port = free_port()
    prefill = P2PWorker(P2PConfig(side_channel_port=port), "A", serves=True)
    prefill.register(make_fake_kv_caches(SHAPE, 1))
    decode = P2PWorker(P2PConfig(side_channel_port=free_port()), "decode", serves=False)
    decode.register(make_fake_kv_caches(SHAPE, None))
    try:
        yield prefill, port, decode
    finally:
        decode.shutdown()
        prefill.shutdown()


def lend(prefill: P2PWorker, port: int, req_id: str, block_id: int) -> BlockPull:
    """The prefill side lends one block; the decode side's pull of it into its block 1."""
    deadline = time.time() + 30
    prefill.start(P2PMetadata(reqs_to_send=[HeldBlocks(req_id, ((block_id,),), deadline)]))
    remote = RemotePrefill(
        "A", req_id, "127.0.0.1", port, ((block_id,),), BLOCK, BLOCK, deadline, 1
    )
    return BlockPull(req_id, ((1,),), ((block_id,),), remote)


def finish(prefill: P2PWorker, decode: P2PWorker, req_id: str) -> None:
    """Polls both sides as their engines' steps do until the pull and the loan both ended."""
    recving: set[str] = set()
    sending: set[str] = set()
    deadline = time.monotonic() + 20
    while req_id not in recving or req_id not in sending:
        assert time.monotonic() < deadline, f"received {recving}, sent {sending}"
        recving |= decode.poll()[1]
        sending |= prefill.poll()[0]
        time.sleep(0.005)


def test_idle_worker_halves_hold_nothing(workers):
    prefill, _, decode = workers
    for worker in (prefill, decode):
        assert set(worker.held()) == WORKER_KINDS and held_kinds(worker.held()) == set()
    unregistered = P2PWorker(P2PConfig(), "never-registered", serves=False)
    assert set(unregistered.held()) == WORKER_KINDS
    assert held_kinds(unregistered.held()) == set()


def test_a_handshake_then_a_read_are_held_until_they_end(workers, monkeypatch):
    prefill, port, decode = workers
    proceed = threading.Event()
    agent = decode.transport._agent
    real_prep = agent.prep_xfer_dlist

    def prep_xfer_dlist(*args, **kwargs):  # NIXL's part of the handshake waits for the test
        assert proceed.wait(10)
        return real_prep(*args, **kwargs)

    monkeypatch.setattr(agent, "prep_xfer_dlist", prep_xfer_dlist)
    first = lend(prefill, port, "r1", 5)
    assert prefill.held()["lender_held"] == ["r1"]
    assert decode.puller.connected_engines() == set()
    decode.start(P2PMetadata(reqs_to_recv=[first]))
    assert decode.held()["handshakes_in_flight"] == {f"127.0.0.1:{port} A": ["r1"]}
    proceed.set()
    finish(prefill, decode, "r1")
    assert held_kinds(decode.held()) == set() and held_kinds(prefill.held()) == set()
    assert decode.puller.connected_engines() == {"A"}  # a connection is kept, not held

    second = lend(prefill, port, "r2", 6)  # the peer is known now: the read starts at once
    decode.start(P2PMetadata(reqs_to_recv=[second]))
    assert held_kinds(decode.held()) == {"reads_in_flight"}
    assert decode.held()["reads_in_flight"] == ["r2"]
    finish(prefill, decode, "r2")
    assert held_kinds(decode.held()) == set() and held_kinds(prefill.held()) == set()
    assert not decode.take_failed_loads()


def test_a_loan_nobody_reads_is_held_until_its_lease_expires(workers):
    prefill, _, _ = workers
    deadline = time.time() + 0.3
    prefill.start(P2PMetadata(reqs_to_send=[HeldBlocks("unread", ((2,),), deadline)]))
    assert prefill.held()["lender_held"] == ["unread"]
    sending: set[str] = set()
    while "unread" not in sending:
        assert time.time() < deadline + 10, "the lease never expired"
        sending |= prefill.poll()[0]
        time.sleep(0.01)
    assert held_kinds(prefill.held()) == set()


# --- the cores, over vLLM's real Schedulers (hma_pair) ----------------------------------------


def test_a_pd_pairs_cores_hold_while_a_pull_is_open_and_nothing_after(tiny_model):
    prefill, decode = Side(tiny_model, "held-p", +1), Side(tiny_model, "held-d", -1)
    try:
        cores = {
            "prefill scheduler": prefill.scheduler.connector.inner,
            "prefill worker": prefill.worker.inner,
            "decode scheduler": decode.scheduler.connector.inner,
            "decode worker": decode.worker.inner,
        }
        seen: dict[str, set[str]] = {name: set() for name in cores}

        def record() -> None:
            for name, core in cores.items():
                seen[name] |= held_kinds(core.held())

        tokens = list(range(700, 700 + 6 * BLOCK + 5))
        params = {"do_remote_decode": True}
        prefill.scheduler.add_request(hma_request("p-1", tokens, params, 1))
        pump([prefill], lambda: record() or "p-1" in prefill.params)
        record()
        decode.scheduler.add_request(hma_request("d-1", tokens, dict(prefill.params["p-1"]), 2))
        pump([prefill, decode], lambda: record() or recved(decode, "d-1"))

        def idle() -> bool:
            record()
            return not decode.scheduler.has_unfinished_requests() and not any(
                held_kinds(core.held()) for core in cores.values()
            )

        pump([prefill, decode], idle)
        assert seen["prefill scheduler"] == {"held_for_readers"}
        assert seen["prefill worker"] == {"lender_held"}
        assert seen["decode scheduler"] == {"pulling", "pull_timers"}
        assert seen["decode worker"] & {"handshakes_in_flight", "reads_in_flight"}
        assert set(cores["decode scheduler"].held()) == SCHEDULER_KINDS
        assert set(cores["decode worker"].held()) == WORKER_KINDS
    finally:
        decode.close()
        prefill.close()
