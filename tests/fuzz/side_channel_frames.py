"""What the side channel's fuzz tests share: their settings, JSON strategies, a pickle payload
that proves it ran, a served peer, and how to send it raw frames."""

import os
import pickle
import socket
import struct
import time
from contextlib import contextmanager
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from kvscope.connector.p2p.transport.layout import KVLayout
from kvscope.connector.p2p.transport.side_channel import (
    MAGIC,
    PROTOCOL_VERSION,
    Frame,
    PeerInfo,
    SideChannelServer,
    fetch_peer_info,
    read_frame,
)
from kvscope.harness.nixl_peer import FakeKVShape, make_fake_kv_caches

from . import DERANDOMIZE

FUZZ = settings(
    max_examples=int(os.environ.get("KVSCOPE_FUZZ_EXAMPLES", "600")),
    deadline=None,  # neighbours on a shared machine make any per-case deadline flaky
    database=None,  # nothing written into the working tree
    derandomize=DERANDOMIZE,  # the same cases every run; KVSCOPE_FUZZ_RANDOM=1 draws new ones
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
PREFIX = struct.Struct("!4sHHII")
MARKER = Path(f"/tmp/kvscope-fuzz-pickle-ran-{os.getpid()}")
"""Created by the pickle payloads below if anything ever unpickles them."""

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=16),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=10,
)


class _CreatesAFile:
    """Unpickling this runs `touch MARKER`: proof that a payload was executed."""

    def __reduce__(self):
        return (os.system, (f"touch {MARKER}",))


def pickle_payload(protocol: int) -> bytes:
    return pickle.dumps(_CreatesAFile(), protocol=protocol)


def fuzzed_peer_info() -> PeerInfo:
    """What the served peer publishes: a small real layout and opaque agent metadata."""
    kv_caches = make_fake_kv_caches(FakeKVShape(num_layers=2, num_blocks=4), seed=None)
    layout = KVLayout.from_layer_tensors("prefill", kv_caches)
    return PeerInfo("agent-prefill", b"\x00nixl-metadata\xff" * 10, layout)


@contextmanager
def fuzzed_server(peer_info: PeerInfo):
    """A live SideChannelServer publishing peer_info; no pickle payload ran by its end."""
    MARKER.unlink(missing_ok=True)
    with SideChannelServer(port=0, io_timeout_s=1.0) as server:
        server.publish(peer_info)
        yield server
    assert not MARKER.exists(), "a pickle payload sent to the side channel was executed"


def exchange(server: SideChannelServer, raw: bytes) -> Frame:
    """Send raw bytes, half-close, and read the server's answer (it must give one)."""
    with socket.create_connection((server.host, server.port), timeout=5) as sock:
        sock.sendall(raw)
        sock.shutdown(socket.SHUT_WR)
        return read_frame(sock, deadline=time.monotonic() + 5)


def assert_refused(server: SideChannelServer, raw: bytes, reason: str = "") -> str:
    refused = server.requests_refused
    answer = exchange(server, raw)
    assert answer.header["type"] == "error", answer.header
    assert answer.body == b""
    error = answer.header["error"]
    assert isinstance(error, str) and error and reason in error, error
    assert server.requests_refused == refused + 1
    return error


def assert_serving(server: SideChannelServer, peer_info: PeerInfo) -> None:
    assert fetch_peer_info(server.host, server.port, timeout_s=5) == peer_info
    assert not MARKER.exists()


def frame_bytes(header: bytes, body: bytes = b"", version=PROTOCOL_VERSION, flags=0) -> bytes:
    return PREFIX.pack(MAGIC, version, flags, len(header), len(body)) + header + body
