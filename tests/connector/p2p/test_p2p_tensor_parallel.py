"""Under tensor parallelism a decode rank handshakes only with the prefill rank of its number."""

import time

import pytest

from kvscope.connector.p2p.config import P2PConfig
from kvscope.connector.p2p.metadata import BlockRelease
from kvscope.connector.p2p.params import RemotePrefill
from kvscope.connector.p2p.puller import BlockPuller
from kvscope.connector.p2p.transport.layout import KVLayout
from kvscope.connector.p2p.transport.side_channel import PeerInfo, SideChannelServer
from kvscope.harness.engine import free_port
from kvscope.harness.nixl_peer import FakeKVShape, make_fake_kv_caches


class FakeTransport:
    """Records the peers the puller accepts; a release is a notification that returns an id."""

    def __init__(self) -> None:
        self.peers: list[KVLayout] = []

    def bind_thread(self) -> None:
        """Host memory: no CUDA device to set on the handshake threads."""

    def add_peer(self, agent_metadata: bytes, layout: KVLayout) -> str:
        self.peers.append(layout)
        return f"agent-rank{layout.tp_rank}"

    def read_blocks(self, *args, **kwargs) -> int:
        return 0

    def poll(self) -> list:
        return []


def rank_info(tp_rank: int) -> PeerInfo:
    kv_caches = make_fake_kv_caches(FakeKVShape(num_layers=2, num_blocks=4, num_kv_heads=1), None)
    layout = KVLayout.from_layer_tensors("prefill", kv_caches, tp_rank=tp_rank, tp_size=2)
    return PeerInfo(f"agent-rank{tp_rank}", b"metadata", layout)


@pytest.mark.parametrize("tp_rank", [0, 1])
def test_decode_rank_handshakes_with_the_same_prefill_rank(tp_rank):
    base = free_port()
    config = P2PConfig(side_channel_port=base)
    # Each prefill rank serves on its own port (its KV lives in its own worker process).
    servers = [SideChannelServer(port=config.side_channel_port_of(rank)) for rank in (0, 1)]
    try:
        for rank, server in enumerate(servers):
            server.publish(rank_info(rank))
        transport = FakeTransport()
        puller = BlockPuller(transport, config, tp_rank=tp_rank)  # type: ignore[arg-type]
        remote = RemotePrefill(
            "prefill", "req-0", "127.0.0.1", base, ((1,),), 32, 32, time.time() + 30, 1
        )
        puller.start([], [BlockRelease("req-0", remote)])
        deadline = time.monotonic() + 10
        while not transport.peers and time.monotonic() < deadline:
            puller.poll()
            time.sleep(0.02)
        puller.close()
    finally:
        for server in servers:
            server.close()
    assert [layout.tp_rank for layout in transport.peers] == [tp_rank]
    assert [s.requests_served for s in servers] == [int(tp_rank == 0), int(tp_rank == 1)]
