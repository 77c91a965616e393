"""A slow handshake with one prefill peer never stalls the decode engine's steps for others.

Real NIXL agents and side channels in one process: prefill engines A, B and C, and a decode
engine that has already read from A. NIXL's part of the handshake with B or C (preparing the
peer's descriptors: layers x blocks of them with LB* layouts, millions on a large GPU) is made
slow or failing by a hook on the decode agent; the engine thread's hooks must stay fast.
"""

import time

import pytest
import torch

pytest.importorskip("vllm")  # the worker half's metadata and spans need vLLM and OpenTelemetry
pytest.importorskip("opentelemetry")

from kvscope.connector.p2p.transport.nixl_agent import load_nixl_api

try:
    load_nixl_api()
except ImportError as exc:
    pytest.skip(f"no NIXL beside this torch: {exc}", allow_module_level=True)

from kvscope.connector.p2p.config import P2PConfig
from kvscope.connector.p2p.metadata import (
    BlockPull,
    BlockRelease,
    HeldBlocks,
    P2PMetadata,
)
from kvscope.connector.p2p.params import RemotePrefill
from kvscope.connector.p2p.worker import P2PWorker
from kvscope.harness.engine import free_port
from kvscope.harness.nixl_peer import FakeKVShape, make_fake_kv_caches

SHAPE = FakeKVShape(num_layers=2, num_blocks=8, num_kv_heads=2, block_size=32, head_dim=32)
SLOW_HANDSHAKE_S = 2.0
STEP_BOUND_S = 0.2  # generous: a step's hooks take milliseconds when nothing stalls them


class Prefill:
    """A prefill engine's worker half serving its side channel, over seeded KV."""

    def __init__(self, engine_id: str, seed: int) -> None:
        self.engine_id = engine_id
        self.port = free_port()
        self.kv_caches = make_fake_kv_caches(SHAPE, seed)
        self.worker = P2PWorker(P2PConfig(side_channel_port=self.port), engine_id, serves=True)
        self.worker.register(self.kv_caches)

    def lend(self, req_id: str, block_ids: tuple[int, ...], lease_s: float = 30) -> RemotePrefill:
        deadline = time.time() + lease_s
        self.worker.start(P2PMetadata(reqs_to_send=[HeldBlocks(req_id, (block_ids,), deadline)]))
        return RemotePrefill(
            self.engine_id,
            req_id,
            "127.0.0.1",
            self.port,
            (block_ids,),
            len(block_ids) * SHAPE.block_size,
            SHAPE.block_size,
            deadline,
            len(block_ids),
        )


@pytest.fixture(scope="module")
def engines():
    prefills = {
        name: Prefill(name, seed)
        for name, seed in (("A", 1), ("B", 2), ("C", 3), ("D", 4), ("E", 5))
    }
    # A lease may fail a pull waiting for NIXL's part of a handshake only past this bound.
    decode_config = P2PConfig(side_channel_port=free_port(), handshake_timeout_s=0.5)
    decode = P2PWorker(decode_config, "decode", serves=False)
    decode.register(make_fake_kv_caches(SHAPE, None))  # its transport keeps the views
    try:
        first = BlockPull("warm-up", ((0,),), ((0,),), prefills["A"].lend("warm-up", (0,)))
        decode.start(P2PMetadata(reqs_to_recv=[first]))
        _step_until(decode, {"warm-up"}, timeout_s=10)
        yield prefills, decode
    finally:
        decode.shutdown()
        for prefill in prefills.values():
            prefill.worker.shutdown()


def _step_until(decode: P2PWorker, req_ids: set[str], timeout_s: float) -> tuple[dict, float]:
    """Poll as the engine thread does each step until these requests finished receiving:
    when each finished (seconds from now) and the slowest poll."""
    started = time.monotonic()
    finished: dict[str, float] = {}
    slowest = 0.0
    while set(finished) != req_ids:
        assert time.monotonic() - started < timeout_s, f"only {sorted(finished)} finished"
        before = time.monotonic()
        _, recving = decode.poll()
        slowest = max(slowest, time.monotonic() - before)
        finished.update({r: time.monotonic() - started for r in recving & req_ids})
        time.sleep(0.002)
    return finished, slowest


def _hook_peer_descriptors(monkeypatch, decode: P2PWorker, prefill: Prefill, hook) -> None:
    """Run `hook` before NIXL prepares the descriptors of this prefill peer's blocks."""
    agent = decode.transport._agent
    real_prep = agent.prep_xfer_dlist
    slow_name = prefill.worker.transport.agent_name

    def prep_xfer_dlist(agent_name, *args, **kwargs):
        if agent_name == slow_name:
            hook()
        return real_prep(agent_name, *args, **kwargs)

    monkeypatch.setattr(agent, "prep_xfer_dlist", prep_xfer_dlist)


def _bits(kv_caches: dict[str, torch.Tensor], block_id: int) -> list[torch.Tensor]:
    """A block's bits in every layer (random bf16 bits hold NaNs, which never compare equal)."""
    return [layer[block_id].view(torch.int16) for layer in kv_caches.values()]


def test_a_slow_handshake_does_not_stall_other_requests_reads(engines, monkeypatch):
    prefills, decode = engines
    _hook_peer_descriptors(monkeypatch, decode, prefills["B"], lambda: time.sleep(SLOW_HANDSHAKE_S))
    slow = BlockPull("via-b", ((1,),), ((5,),), prefills["B"].lend("via-b", (5,)))
    fast = BlockPull("via-a", ((2,),), ((6,),), prefills["A"].lend("via-a", (6,)))
    started = time.monotonic()
    decode.start(P2PMetadata(reqs_to_recv=[slow]))
    decode.start(P2PMetadata(reqs_to_recv=[fast]))
    start_s = time.monotonic() - started
    finished, slowest_poll = _step_until(decode, {"via-a", "via-b"}, timeout_s=20)

    assert start_s < STEP_BOUND_S, f"start_load_kv took {start_s:.2f} s"
    assert slowest_poll < STEP_BOUND_S, f"a step's get_finished took {slowest_poll:.2f} s"
    assert finished["via-a"] < SLOW_HANDSHAKE_S <= finished["via-b"]  # B's waited, A's did not
    assert not decode.take_failed_loads()
    local = decode.transport._kv_caches
    for block_id, prefill, remote_id in ((1, prefills["B"], 5), (2, prefills["A"], 6)):
        for got, want in zip(
            _bits(local, block_id), _bits(prefill.kv_caches, remote_id), strict=True
        ):
            assert torch.equal(got, want)


def test_a_failed_background_handshake_fails_only_that_peers_requests(engines, monkeypatch):
    prefills, decode = engines

    def refuse() -> None:
        time.sleep(0.5)
        raise RuntimeError("NIXL_ERR_BACKEND")

    _hook_peer_descriptors(monkeypatch, decode, prefills["C"], refuse)
    failing = BlockPull("via-c", ((3,),), ((4,),), prefills["C"].lend("via-c", (4,)))
    fine = BlockPull("via-a-2", ((4,),), ((7,),), prefills["A"].lend("via-a-2", (7,)))
    decode.start(P2PMetadata(reqs_to_recv=[failing, fine]))
    _, slowest_poll = _step_until(decode, {"via-c", "via-a-2"}, timeout_s=20)

    assert slowest_poll < STEP_BOUND_S
    assert decode.take_failed_loads() == {"via-c"}
    assert decode.take_load_errors() == {3}  # recomputed under the failure policy
    cause = decode.take_worker_meta().loads_failed["via-c"]
    assert cause.startswith("peer_unreachable: handshake failed") and "NIXL_ERR_BACKEND" in cause


def test_a_pull_whose_lease_ends_during_a_slow_handshake_fails_then(engines, monkeypatch):
    """The prefill side frees the blocks at the lease's end: a pull still waiting for its peer's
    handshake then fails (and is recomputed) at once, not when the handshake ends."""
    prefills, decode = engines
    _hook_peer_descriptors(monkeypatch, decode, prefills["D"], lambda: time.sleep(SLOW_HANDSHAKE_S))
    lease_s = 1.6  # the decode side stops trusting it lease_margin_s (1 s) earlier
    late = BlockPull("via-d", ((5,),), ((1,),), prefills["D"].lend("via-d", (1,), lease_s))
    decode.start(P2PMetadata(reqs_to_recv=[late]))
    finished, slowest_poll = _step_until(decode, {"via-d"}, timeout_s=10)

    assert finished["via-d"] < SLOW_HANDSHAKE_S - 0.5, "the pull waited for the handshake"
    assert slowest_poll < STEP_BOUND_S
    assert decode.take_load_errors() == {5}
    cause = decode.take_worker_meta().loads_failed["via-d"]
    assert cause == "lease_expired: lease expired during the handshake"


def test_a_release_to_a_new_peer_goes_out_without_another_engine_step(engines):
    """A decode request that needs none of the prefilled blocks releases them; its engine may
    never step again, yet the prefill side must not hold the blocks until the lease ends."""
    prefills, decode = engines
    release = BlockRelease("needs-none", prefills["E"].lend("lent", (2, 3)))
    decode.start(P2PMetadata(reqs_to_release=[release]))  # then the decode engine idles
    started = time.monotonic()
    sent: set[str] = set()
    while "lent" not in sent:
        assert time.monotonic() - started < 10, "the prefill side still holds the blocks"
        sent |= prefills["E"].worker.poll()[0]
        time.sleep(0.01)
    assert prefills["E"].worker.lender.stats["reads_notified"] == 1  # released, not expired
