"""Two real processes: a KV owner serves blocks, this process reads them with the transport."""

import time

import psutil
import pytest
import torch

from kvscope.connector.p2p.transport.nixl_transport import NixlTransport, TransportConfig
from kvscope.connector.p2p.transport.results import PeerRejectedError
from kvscope.connector.p2p.transport.side_channel import fetch_peer_info
from kvscope.harness.nixl_peer import (
    FakeKVShape,
    PeerProcess,
    make_fake_kv_caches,
)

SHAPE = FakeKVShape(num_layers=4, num_blocks=64, num_kv_heads=2, block_size=32, head_dim=32)
OWNER_SEED = 7


@pytest.fixture(scope="module")
def owner():
    peer = PeerProcess("prefill", SHAPE, seed=OWNER_SEED)
    yield peer
    peer.stop()


@pytest.fixture(scope="module")
def reader():
    local = make_fake_kv_caches(FakeKVShape(**{**SHAPE.__dict__, "num_blocks": 32}), seed=None)
    with NixlTransport("decode", local, config=TransportConfig(transfer_timeout_s=10)) as t:
        yield t, local


@pytest.fixture(scope="module")
def owner_peer(owner, reader) -> str:
    """The owner, handshaken and added (the first connection is paid once per module)."""
    transport, _ = reader
    info = fetch_peer_info("127.0.0.1", owner.port, timeout_s=5)
    return transport.add_peer(info.agent_metadata, info.layout)


def test_handshake_over_the_side_channel_names_the_owners_agent(owner, owner_peer):
    assert owner_peer == owner.agent_name
    assert owner_peer.startswith("kvscope-prefill-tp0-")


def test_read_of_scattered_blocks_is_byte_exact_in_every_layer(reader, owner_peer):
    transport, local = reader
    remote_ids, local_ids = [63, 0, 17, 18, 40], [3, 30, 11, 12, 0]
    xfer_id = transport.read_blocks(owner_peer, remote_ids, local_ids)
    (result,) = transport.wait([xfer_id], timeout_s=10)
    assert result.ok, result.cause
    assert result.nbytes == len(remote_ids) * transport.layout.bytes_per_block
    assert result.duration_s > 0
    owners_kv = make_fake_kv_caches(SHAPE, seed=OWNER_SEED)
    untouched = [i for i in range(32) if i not in local_ids]
    for name, layer in local.items():
        got = layer[local_ids].view(torch.int16)
        assert torch.equal(got, owners_kv[name][remote_ids].view(torch.int16)), name
        assert not layer[untouched].view(torch.int16).any(), f"{name}: a block outside the read"


def test_completed_read_notifies_the_owner(owner, reader, owner_peer):
    transport, _ = reader
    owner.request({"cmd": "expect", "msg": "req-42:done", "timeout_s": 10})
    xfer_id = transport.read_blocks(owner_peer, [5, 6], [1, 2], notif_msg=b"req-42:done")
    (result,) = transport.wait([xfer_id], timeout_s=10)
    assert result.ok, result.cause
    notifs: list = []
    deadline = time.monotonic() + 5
    while not notifs and time.monotonic() < deadline:
        reply = owner.request({"cmd": "notifs"})
        notifs, expired = reply["notifs"], reply["expired"]
        time.sleep(0.01)
    assert notifs == [[transport.agent_name, "req-42:done"]]
    assert expired == []


def test_owner_learns_of_a_read_that_never_came(owner):
    owner.request({"cmd": "expect", "msg": "req-7:done", "timeout_s": 0.2})
    time.sleep(0.4)
    assert owner.request({"cmd": "notifs"})["expired"] == ["req-7:done"]


def test_bad_requests_fail_fast_with_a_cause(reader, owner_peer):
    transport, _ = reader
    unknown = transport.read_blocks("no-such-agent", [1], [1])
    out_of_range = transport.read_blocks(owner_peer, [64], [0])
    uneven = transport.read_blocks(owner_peer, [1, 2], [0])
    results = {r.xfer_id: r for r in transport.wait([unknown, out_of_range, uneven], 1)}
    assert "unknown peer 'no-such-agent'" in results[unknown].cause
    assert "remote block ids must lie in [0, 64)" in results[out_of_range].cause
    assert "one local block per remote block" in results[uneven].cause


def test_incompatible_layout_is_refused_at_add_peer(owner):
    other = FakeKVShape(**{**SHAPE.__dict__, "block_size": 64, "num_blocks": 4})
    info = fetch_peer_info("127.0.0.1", owner.port, timeout_s=5)
    with NixlTransport("decode-b64", make_fake_kv_caches(other, seed=None)) as mismatched:
        with pytest.raises(PeerRejectedError, match="block_size in tokens: local 64, remote 32"):
            mismatched.add_peer(info.agent_metadata, info.layout)
        with pytest.raises(PeerRejectedError, match="NIXL refused the metadata"):
            mismatched.add_peer(b"garbage" * 10, mismatched.layout)


def test_a_block_outermost_owner_serves_a_layer_outermost_reader():
    """Prefill in BLHNC (one run per block), decode in LBHNC: traded as layer pages."""
    shape = FakeKVShape(num_layers=2, num_blocks=16, kv_layout="BLHNC")
    owner = PeerProcess("prefill-blhnc", shape, seed=OWNER_SEED)
    try:
        local = make_fake_kv_caches(FakeKVShape(num_layers=2, num_blocks=16), seed=None)
        with NixlTransport("decode-lbhnc", local, kv_layout="LBHNC") as transport:
            info = fetch_peer_info("127.0.0.1", owner.port, timeout_s=5)
            assert info.layout.kv_layout == "BLHNC" and info.layout.block_runs
            peer = transport.add_peer(info.agent_metadata, info.layout)
            (result,) = transport.wait([transport.read_blocks(peer, [15, 2], [0, 9])], 10)
            assert result.ok, result.cause
            assert result.descriptors == 2 * shape.num_layers
    finally:
        owner.stop()
    owners_kv = make_fake_kv_caches(shape, seed=OWNER_SEED)
    for name, layer in local.items():
        assert torch.equal(
            layer[[0, 9]].view(torch.int16), owners_kv[name][[15, 2]].view(torch.int16)
        )
        assert not layer[1:9].view(torch.int16).any()


def thread_cpu_seconds() -> dict[int, float]:
    """CPU seconds (user + system) of each thread of this process, by thread id."""
    return {t.id: t.user_time + t.system_time for t in psutil.Process().threads()}


def test_idle_agents_use_almost_no_cpu(owner, reader, owner_peer):
    transport, _ = reader
    time.sleep(0.3)  # let the short fast-polling tail after the last activity run out
    steps_before = transport.poller_stats.steps
    threads_before, owner_before = thread_cpu_seconds(), owner.cpu_seconds()
    time.sleep(2.0)
    threads_after = thread_cpu_seconds()
    # Per thread: under xdist this process also runs the threads earlier modules left (span
    # exporters, servers), whose wake-ups added up to 2.5% of a core once. A spinning thread
    # is what this looks for: NIXL's own progress thread would show ~1.0 here.
    busiest = max(
        (after - threads_before.get(tid, 0.0)) / 2.0 for tid, after in threads_after.items()
    )
    owner_share = (owner.cpu_seconds() - owner_before) / 2.0
    # Ours sleeps but for a 1 s heartbeat.
    assert transport.poller_stats.steps - steps_before <= 3
    assert busiest < 0.02, f"a reader thread used {busiest:.1%} of a core while idle"
    assert owner_share < 0.02, f"owner used {owner_share:.1%} of a core while idle"


def test_an_owner_polls_fast_while_a_read_is_due_then_backs_off_then_sleeps(reader):
    transport, _ = reader
    stats = transport.poller_stats
    first = stats.steps
    started = time.monotonic()
    transport.expect_remote_read(b"req-backoff:done", timeout_s=2.4)
    time.sleep(0.2)
    early = stats.steps - first  # 1 ms apart for the first second (fast_wait_s)
    time.sleep(1.7 - (time.monotonic() - started))
    before_late = stats.steps
    time.sleep(0.5)
    late = stats.steps - before_late  # from 1.45 s on, 10 ms apart: ~50 in 0.5 s
    time.sleep(max(2.6 - (time.monotonic() - started), 0))  # it expires at 2.4 s
    assert transport.expired_remote_reads() == [b"req-backoff:done"]
    before_idle = stats.steps
    time.sleep(0.5)
    assert early >= 40, f"{early} steps in the first 0.2 s"
    assert late <= 70, f"{late} steps in 0.5 s after backing off"
    assert stats.steps - before_idle <= 2  # asleep: nothing is due
