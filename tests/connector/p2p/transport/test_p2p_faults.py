"""An owner that hangs or dies during a read: the reader gets a failed result in time."""

import time

import pytest

from kvscope.connector.p2p.transport import nixl_agent
from kvscope.connector.p2p.transport.nixl_transport import NixlTransport
from kvscope.connector.p2p.transport.side_channel import fetch_peer_info
from kvscope.harness.nixl_peer import (
    FakeKVShape,
    PeerProcess,
    make_fake_kv_caches,
)

# Large enough (32 MiB) that a read is still running when the owner is stopped or killed.
SHAPE = FakeKVShape(num_layers=8, num_blocks=256, num_kv_heads=4, block_size=32, head_dim=64)


@pytest.fixture(scope="module")
def victim():
    """An owner this module stops and then kills; the reader has read from it once before."""
    peer = PeerProcess("victim", SHAPE, seed=None)
    local = make_fake_kv_caches(SHAPE, seed=None)
    transport = NixlTransport("decode", local)
    try:
        info = fetch_peer_info("127.0.0.1", peer.port, timeout_s=5)
        name = transport.add_peer(info.agent_metadata, info.layout)
        for _ in range(2):  # UCX settles the connection's lanes over the first reads
            (warm_up,) = transport.wait([transport.read_blocks(name, [1], [1])], timeout_s=10)
            assert warm_up.ok, warm_up.cause
            time.sleep(0.1)
        yield peer, transport, name
    finally:
        peer.kill()
        transport.close()


def _read_all(transport: NixlTransport, peer: str, timeout_s: float) -> int:
    all_blocks = list(range(SHAPE.num_blocks))
    return transport.read_blocks(peer, all_blocks, all_blocks, b"req:done", timeout_s=timeout_s)


def test_hung_peer_fails_reads_at_their_timeout(victim):
    peer, transport, name = victim
    peer.pause()  # alive, sockets open, never answers
    # UCX may finish the first read one-sided (the owner's memory is readable while it is
    # stopped); the reads after it wait for the owner. None may outlast its timeout.
    results = []
    for _ in range(3):
        started = time.monotonic()
        (result,) = transport.wait([_read_all(transport, name, timeout_s=0.5)], timeout_s=5)
        assert time.monotonic() - started < 1.5
        results.append(result)
    timed_out = [r for r in results if not r.ok]
    assert timed_out, "every read finished although the owner was stopped"
    assert all("timed out after 0.5 s" in r.cause and "hung" in r.cause for r in timed_out)
    assert all(0.5 <= r.duration_s < 1.5 for r in timed_out)


def test_a_timed_out_read_is_reported_only_once_nixl_released_it(victim, monkeypatch):
    """Until NIXL lets go of the read, the NIC may still write into its blocks: the read
    stays unreported (vLLM keeps the request waiting and its blocks allocated)."""
    peer, transport, name = victim
    peer.pause()
    refusing = True
    real_release = nixl_agent.release_quietly
    monkeypatch.setattr(
        nixl_agent, "release_quietly", lambda handle: not refusing and real_release(handle)
    )
    for _ in range(3):  # a read may still finish one-sided (see above): retry until one hangs
        xfer_id = _read_all(transport, name, timeout_s=0.3)
        time.sleep(1.0)
        if not (ended := transport.poll()):
            break
        assert all(r.ok for r in ended), "a read failed although NIXL did not release it"
    assert transport.poll() == [], "a read was reported before NIXL released it"
    refusing = False
    (result,) = transport.wait([xfer_id], timeout_s=5)
    assert "timed out after 0.3 s" in result.cause
    assert result.duration_s >= 1.0  # reported at the release, not at the timeout


def test_peer_killed_mid_read_fails_the_read_well_before_its_timeout(victim):
    peer, transport, name = victim
    peer.pause()
    transport.wait([_read_all(transport, name, timeout_s=0.3)], timeout_s=5)  # see above
    started = time.monotonic()
    xfer_id = _read_all(transport, name, timeout_s=20)
    time.sleep(0.2)
    assert transport.poll() == []  # in flight, waiting for the stopped owner
    peer.kill()
    (result,) = transport.wait([xfer_id], timeout_s=20)
    assert not result.ok
    assert "disconnected" in result.cause, result.cause
    assert time.monotonic() - started < 5.0


def test_reads_from_a_dead_peer_fail_at_once(victim):
    _, transport, name = victim
    xfer_id = transport.read_blocks(name, [1, 2], [1, 2])
    (result,) = transport.wait([xfer_id], timeout_s=5)
    assert not result.ok and "disconnected" in result.cause
    assert result.duration_s < 1.0
