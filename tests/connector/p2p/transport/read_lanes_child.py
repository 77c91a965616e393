"""A reader process for the lane tests: reads blocks from a stand-in owner, prints one JSON line
with each read's result and the lanes UCX said it used (run under the UCX_* env to test)."""

import json
import sys

from kvscope.connector.p2p.transport.nixl_transport import NixlTransport
from kvscope.connector.p2p.transport.side_channel import fetch_peer_info
from kvscope.harness.nixl_peer import FakeKVShape, PeerProcess, make_fake_kv_caches

SHAPE = FakeKVShape(num_layers=4, num_blocks=64)


def main() -> None:
    owner = PeerProcess("prefill", SHAPE, seed=7)
    try:
        local = make_fake_kv_caches(SHAPE, seed=None)
        with NixlTransport("decode", local) as transport:
            info = fetch_peer_info("127.0.0.1", owner.port, timeout_s=10)
            peer = transport.add_peer(info.agent_metadata, info.layout)
            reads = []
            for count in (4, 64):
                xfer_id = transport.read_blocks(peer, list(range(count)), list(range(count)))
                (result,) = transport.wait([xfer_id], timeout_s=20)
                lanes = transport.read_lanes()
                reads.append(
                    {
                        "ok": result.ok,
                        "bytes": result.nbytes,
                        "duration_s": result.duration_s,
                        "backend": result.nixl.backend if result.nixl else None,
                        "nixl_bytes": result.nixl.total_bytes if result.nixl else None,
                        "scope": lanes.scope,
                        "data": list(lanes.data),
                        "control": list(lanes.control),
                    }
                )
        print("LANES " + json.dumps(reads), flush=True)
    finally:
        owner.stop()


if __name__ == "__main__":
    sys.exit(main())
