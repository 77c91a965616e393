"""Lending the KV cache away (vLLM's sleep, 0.34's weight updates) over real NIXL agents.

suspend() must leave nothing that could write into the memory once it returns: a read in flight
(here: from an owner process that is stopped, so the read waits on it) ends failed, reported
only after NIXL released it; if NIXL will not release it, suspend() refuses and the memory stays
registered and in use. resume() registers the memory again, and reads after a new handshake
bring the owner's bytes.
"""

import time

import pytest
import torch

from kvscope.connector.p2p.transport import nixl_agent
from kvscope.connector.p2p.transport.nixl_transport import LENT_CAUSE, NixlTransport
from kvscope.connector.p2p.transport.results import TransportError
from kvscope.connector.p2p.transport.side_channel import fetch_peer_info
from kvscope.harness.nixl_peer import (
    FakeKVShape,
    PeerProcess,
    make_fake_kv_caches,
)

try:
    nixl_agent.load_nixl_api()
except ImportError as exc:
    pytest.skip(f"no NIXL beside this torch: {exc}", allow_module_level=True)

# Large enough (32 MiB) that a read is still running when the owner is stopped.
SHAPE = FakeKVShape(num_layers=8, num_blocks=256, num_kv_heads=4, block_size=32, head_dim=64)
OWNER_SEED = 7


@pytest.fixture(scope="module")
def owner():
    peer = PeerProcess("lender", SHAPE, seed=OWNER_SEED)
    try:
        yield peer
    finally:
        peer.kill()


@pytest.fixture
def reader(owner):
    """A transport that has read from the owner; the owner runs again afterwards."""
    transport = NixlTransport("decode", make_fake_kv_caches(SHAPE, seed=None))
    try:
        name = _handshake(transport, owner)
        yield transport, name
    finally:
        if owner._state() == "T":
            owner.resume()
        transport.close()


def _handshake(transport: NixlTransport, owner: PeerProcess) -> str:
    info = fetch_peer_info("127.0.0.1", owner.port, timeout_s=5)
    name = transport.add_peer(info.agent_metadata, info.layout)
    for _ in range(2):  # UCX settles the connection's lanes over the first reads
        (warm_up,) = transport.wait([transport.read_blocks(name, [1], [1])], timeout_s=10)
        assert warm_up.ok, warm_up.cause
        time.sleep(0.1)
    return name


def _hanging_read(transport: NixlTransport, name: str, owner: PeerProcess) -> int:
    """A read of every block left in flight: the owner is stopped, and its notification waits
    on it (a read may still end one-sided, so retry until one waits)."""
    owner.pause()
    blocks = list(range(SHAPE.num_blocks))
    for _ in range(10):
        xfer_id = transport.read_blocks(name, blocks, blocks, b"req:done", timeout_s=30)
        time.sleep(0.2)
        if not (ended := transport.poll()):
            return xfer_id
        assert all(r.ok for r in ended), [r.cause for r in ended]
    pytest.skip("UCX finished every read one-sided with the owner stopped")


def _assert_blocks_are_the_owners(transport: NixlTransport, blocks: list[int]) -> None:
    owners = make_fake_kv_caches(SHAPE, OWNER_SEED)
    for name, layer in transport._kv_caches.items():
        got, want = layer[blocks].view(torch.int16), owners[name][blocks].view(torch.int16)
        assert torch.equal(got, want), name


def test_suspend_fails_a_read_in_flight_and_reports_it_once_released(reader, owner):
    transport, name = reader
    xfer_id = _hanging_read(transport, name, owner)
    transport.suspend(timeout_s=10)
    assert transport.suspended
    (result,) = transport.poll()
    assert result.xfer_id == xfer_id and result.cause == LENT_CAUSE
    refused = transport.read_blocks(name, [2], [2])
    (result,) = transport.wait([refused], timeout_s=5)
    assert result.cause == LENT_CAUSE, "a read was posted into memory lent away"


def test_resume_registers_again_and_a_new_handshake_reads_the_owners_bytes(reader, owner):
    transport, name = reader
    _hanging_read(transport, name, owner)
    transport.suspend(timeout_s=10)
    transport.poll()
    owner.resume()
    transport.resume()
    assert not transport.suspended and transport.registrations == 2
    (stale,) = transport.wait([transport.read_blocks(name, [3], [3])], timeout_s=5)
    assert "unknown peer" in stale.cause, "a peer loaded before the loan was kept"
    name = _handshake(transport, owner)
    (result,) = transport.wait([transport.read_blocks(name, [5, 9], [5, 9])], timeout_s=10)
    assert result.ok, result.cause
    _assert_blocks_are_the_owners(transport, [5, 9])


def test_suspend_refuses_while_nixl_holds_a_read_and_keeps_serving(reader, owner, monkeypatch):
    transport, name = reader
    xfer_id = _hanging_read(transport, name, owner)
    real_release = nixl_agent.release_quietly
    refusing = True
    monkeypatch.setattr(
        nixl_agent, "release_quietly", lambda handle: not refusing and real_release(handle)
    )
    with pytest.raises(TransportError, match="stays registered"):
        transport.suspend(timeout_s=0.3)
    assert not transport.suspended
    assert transport.poll() == [], "a read was reported before NIXL released it"
    refusing = False
    (result,) = transport.wait([xfer_id], timeout_s=5)
    assert result.cause == LENT_CAUSE
    owner.resume()
    (result,) = transport.wait([transport.read_blocks(name, [4], [4])], timeout_s=10)
    assert result.ok, result.cause
