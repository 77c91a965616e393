"""The handshake server answers good requests and shrugs off bad clients; the client never hangs."""

import contextlib
import select
import socket
import struct
import time

import pytest

from kvscope.connector.p2p.transport.layout import KVLayout
from kvscope.connector.p2p.transport.side_channel import (
    MAGIC,
    MAX_BODY_BYTES,
    PROTOCOL_VERSION,
    Frame,
    PeerInfo,
    SideChannelError,
    SideChannelServer,
    encode_frame,
    fetch_peer_info,
    read_frame,
)
from kvscope.harness.nixl_peer import FakeKVShape, make_fake_kv_caches

PREFIX = struct.Struct("!4sHHII")


@pytest.fixture(scope="module")
def peer_info() -> PeerInfo:
    kv_caches = make_fake_kv_caches(FakeKVShape(num_layers=2, num_blocks=4), seed=None)
    layout = KVLayout.from_layer_tensors("prefill", kv_caches)
    return PeerInfo("agent-prefill", b"\x00nixl-metadata\xff" * 100, layout)


@pytest.fixture(scope="module")
def server(peer_info):
    with SideChannelServer(port=0, io_timeout_s=0.5) as server:
        server.publish(peer_info)
        yield server


def _exchange(server: SideChannelServer, raw: bytes) -> Frame | None:
    """Send raw bytes; the server's answer, or None if it just closed the connection."""
    with socket.create_connection((server.host, server.port), timeout=3) as sock:
        sock.sendall(raw)
        sock.shutdown(socket.SHUT_WR)
        try:
            return read_frame(sock)
        except ConnectionError:
            return None


def test_handshake_returns_metadata_and_layout(server, peer_info):
    fetched = fetch_peer_info(server.host, server.port, timeout_s=3)
    assert fetched == peer_info


def test_unknown_tp_rank_is_refused_with_a_reason(server):
    with pytest.raises(SideChannelError, match="refused the handshake"):
        fetch_peer_info(server.host, server.port, tp_rank=3, timeout_s=3)


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (PREFIX.pack(MAGIC, PROTOCOL_VERSION + 1, 0, 2, 0) + b"{}", "version 2 is not supported"),
        (PREFIX.pack(MAGIC, PROTOCOL_VERSION, 0, 10, MAX_BODY_BYTES + 1), "message too large"),
        (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", "not a kvscope side-channel message"),
        (PREFIX.pack(MAGIC, PROTOCOL_VERSION, 0, 5, 0) + b"\xff{]x!", "header is not JSON"),
        (encode_frame(Frame({"type": "put_blocks"})), "unknown request type"),
    ],
    ids=["wrong-version", "oversized", "garbage", "bad-json", "unknown-type"],
)
def test_bad_messages_get_an_error_and_the_server_keeps_serving(server, peer_info, raw, reason):
    refused_before = server.requests_refused
    answer = _exchange(server, raw)
    assert answer is not None and answer.header["type"] == "error"
    assert reason in answer.header["error"]
    assert server.requests_refused == refused_before + 1
    assert fetch_peer_info(server.host, server.port, timeout_s=3) == peer_info


def test_truncated_and_silent_clients_do_not_block_others(server, peer_info):
    truncated = encode_frame(Frame({"type": "get_peer_info"}))[:-3]
    answer = _exchange(server, truncated)
    assert answer is not None and "connection closed after" in answer.header["error"]
    with socket.create_connection((server.host, server.port), timeout=3):
        started = time.monotonic()  # a client that connects and says nothing, held open
        assert fetch_peer_info(server.host, server.port, timeout_s=3) == peer_info
        assert time.monotonic() - started < 0.4  # served at once, not after the silent one


def test_a_client_dripping_bytes_is_cut_off_at_the_deadline(server, peer_info):
    """io_timeout_s bounds the whole request, not each recv: a slow drip cannot hold a slot."""
    request = encode_frame(Frame({"type": "get_peer_info", "padding": "x" * 64}))
    with socket.create_connection((server.host, server.port), timeout=3) as sock:
        started = time.monotonic()
        with contextlib.suppress(OSError):  # the server may close while we still drip
            for byte in request:  # each byte well inside 0.5 s, the whole far beyond it
                sock.sendall(bytes([byte]))
                if select.select([sock], [], [], 0.1)[0] or time.monotonic() - started > 3:
                    break  # the server answered (or gave up on us)
        answer = read_frame(sock)
        assert "TimeoutError" in answer.header["error"]
        assert time.monotonic() - started < 1.5
        with pytest.raises(OSError):  # nor is a drip after the answer read for long
            for _ in range(40):
                sock.sendall(b"x")
                time.sleep(0.1)
        assert time.monotonic() - started < 3.5
    assert fetch_peer_info(server.host, server.port, timeout_s=3) == peer_info


def test_a_request_with_a_body_or_flags_is_refused_before_its_body_is_read(server):
    with_body = PREFIX.pack(MAGIC, PROTOCOL_VERSION, 0, 2, 1 << 20) + b"{}"
    answer = _exchange(server, with_body)
    assert "body 1048576 B (max 0)" in answer.header["error"]
    flagged = PREFIX.pack(MAGIC, PROTOCOL_VERSION, 1, 2, 0) + b"{}"
    assert "flags must be 0" in _exchange(server, flagged).header["error"]


def test_client_gives_up_on_a_peer_that_never_answers():
    with socket.create_server(("127.0.0.1", 0)) as mute:  # accepts (backlog), never replies
        started = time.monotonic()
        with pytest.raises(SideChannelError, match="did not answer within 0.3 s"):
            fetch_peer_info("127.0.0.1", mute.getsockname()[1], timeout_s=0.3)
        assert time.monotonic() - started < 2.0


def test_client_refuses_an_answer_in_another_version():
    with socket.create_server(("127.0.0.1", 0)) as fake:
        port = fake.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port), timeout=3) as client:
            conn, _ = fake.accept()
            with conn:
                conn.sendall(PREFIX.pack(MAGIC, 9, 0, 2, 0) + b"{}")
                with pytest.raises(ValueError, match="version 9 is not supported"):
                    read_frame(client)


def test_nothing_listening_is_a_clear_error():
    with socket.create_server(("127.0.0.1", 0)) as placeholder:
        port = placeholder.getsockname()[1]
    with pytest.raises(SideChannelError, match=f"127.0.0.1:{port}"):
        fetch_peer_info("127.0.0.1", port, timeout_s=1)


def test_a_withdrawn_rank_is_refused_with_the_reason_until_published_again(peer_info):
    with SideChannelServer(port=0, io_timeout_s=0.5) as server:
        server.publish(peer_info)
        server.withdraw(0, "the KV cache was lent away: handshake again later")
        with pytest.raises(SideChannelError, match="tp_rank 0: the KV cache was lent away"):
            fetch_peer_info(server.host, server.port, timeout_s=3)
        again = PeerInfo(peer_info.agent_name, peer_info.agent_metadata, peer_info.layout, 2)
        server.publish(again)
        assert fetch_peer_info(server.host, server.port, timeout_s=3).registration == 2


@pytest.mark.parametrize("registration", [-1, "1", True])
def test_a_peer_info_with_a_bad_registration_is_refused(peer_info, registration):
    frame = peer_info.to_frame()
    with pytest.raises(ValueError, match="bad registration"):
        PeerInfo.from_frame(Frame({**frame.header, "registration": registration}, frame.body))


def test_a_peer_info_without_a_registration_names_0(peer_info):
    frame = peer_info.to_frame()
    header = {k: v for k, v in frame.header.items() if k != "registration"}
    assert PeerInfo.from_frame(Frame(header, frame.body)).registration == 0
