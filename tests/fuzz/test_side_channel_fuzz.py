"""Fuzzes the P2P side channel: bad input gets a reason, good peers are still served, nothing runs.

A live SideChannelServer gets random bytes, truncated frames, wrong versions, flags and sizes,
malformed JSON headers and pickle payloads; fetch_peer_info gets garbage answers from a fake
owner. KVSCOPE_FUZZ_EXAMPLES sets the cases per property (default 600: some
4,000 cases in all, about 15 s on two busy cores).
"""

import json
import os
import pickle
import socket
import struct
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvscope.connector.p2p.transport import side_channel
from kvscope.connector.p2p.transport.layout import KVLayout
from kvscope.connector.p2p.transport.side_channel import (
    MAGIC,
    MAX_HEADER_BYTES,
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

from . import DERANDOMIZE

pytestmark = pytest.mark.timeout(300)

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


@pytest.fixture(scope="module")
def peer_info() -> PeerInfo:
    kv_caches = make_fake_kv_caches(FakeKVShape(num_layers=2, num_blocks=4), seed=None)
    layout = KVLayout.from_layer_tensors("prefill", kv_caches)
    return PeerInfo("agent-prefill", b"\x00nixl-metadata\xff" * 10, layout)


@pytest.fixture(scope="module")
def server(peer_info):
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


# --- the server -------------------------------------------------------------------------------


@FUZZ
@given(raw=st.binary(max_size=2048) | st.binary(max_size=64).map(lambda b: MAGIC + b))
def test_random_bytes_are_refused(server, raw):
    if raw.startswith(MAGIC) and len(raw) >= PREFIX.size:
        _, version, flags, header_len, body_len = PREFIX.unpack(raw[: PREFIX.size])
        good_prefix = version == PROTOCOL_VERSION and flags == 0 and body_len == 0
        if good_prefix and header_len <= MAX_HEADER_BYTES:
            return  # a well-formed prefix: the header tests cover what follows
    assert_refused(server, raw)


@FUZZ
@given(header=json_values, body=st.binary(max_size=8))
def test_headers_that_are_not_a_request_object_are_refused(server, header, body):
    if isinstance(header, dict) and isinstance(header.get("type"), str):
        header["type"] = "x" + header["type"]  # never get_peer_info: always a refusal
    assert_refused(server, frame_bytes(json.dumps(header).encode(), body))


@FUZZ
@given(
    request_type=st.sampled_from(["get_peer_info"]) | st.text(max_size=40) | json_values,
    tp_rank=st.just(0) | st.integers() | json_values,
    extra=st.dictionaries(
        st.text(max_size=8).filter(lambda k: k not in ("type", "tp_rank")), json_values, max_size=3
    ),
)
def test_requests_are_answered_exactly_when_they_are_good(
    server, peer_info, request_type, tp_rank, extra
):
    request = {**extra, "type": request_type, "tp_rank": tp_rank}
    raw = frame_bytes(json.dumps(request).encode())
    good = request_type == "get_peer_info" and type(tp_rank) is int and tp_rank == 0
    if good:
        answer = exchange(server, raw)
        assert PeerInfo.from_frame(answer) == peer_info
    else:
        assert_refused(server, raw)


@FUZZ
@given(
    raw_header=st.binary(max_size=256)
    | st.integers(1, 3000).map(lambda depth: b"[" * depth + b"]" * depth)
    | st.integers(1, 3000).map(lambda depth: b'{"a":' * depth + b"1" + b"}" * depth)
    | st.integers(4301, 6000).map(
        lambda digits: b'{"type":"get_peer_info","tp_rank":' + b"7" * digits + b"}"
    )
)
def test_malformed_json_and_nesting_bombs_are_refused(server, raw_header):
    try:
        parsed = json.loads(raw_header)
    except (ValueError, RecursionError):
        parsed = None
    if isinstance(parsed, dict) and parsed.get("type") == "get_peer_info":
        return  # by chance a good request
    assert_refused(server, frame_bytes(raw_header))


@settings(FUZZ, max_examples=min(FUZZ.max_examples, 40))
@given(
    request_type=st.text(
        st.characters(min_codepoint=0x80, max_codepoint=0x7FF), min_size=1000, max_size=30000
    )
)
def test_error_answers_stay_small_whatever_the_request_quotes(server, request_type):
    """2 bytes of UTF-8 quote as 4 characters: an error must not outgrow a frame."""
    raw = frame_bytes(json.dumps({"type": request_type}, ensure_ascii=False).encode())
    error = assert_refused(server, raw, "unknown request type")
    assert len(error) <= 400


@FUZZ
@given(extra=st.dictionaries(st.text(max_size=8), st.text(max_size=40), max_size=3), data=st.data())
def test_truncated_requests_are_refused_and_say_how_far_they_got(server, extra, data):
    whole = encode_frame(Frame({**extra, "type": "get_peer_info", "tp_rank": 0}))
    cut = data.draw(st.integers(0, len(whole) - 1), label="cut")
    assert_refused(server, whole[:cut], "connection closed after")


@FUZZ
@given(
    version=st.integers(0, 2**16 - 1).filter(lambda v: v != PROTOCOL_VERSION),
    flags=st.integers(0, 2**16 - 1),
    header_len=st.integers(0, 2**32 - 1),
    body_len=st.integers(0, 2**32 - 1),
    which=st.sampled_from(["version", "flags", "sizes"]),
)
def test_wrong_version_flags_and_sizes_are_refused_before_any_body_is_read(
    server, version, flags, header_len, body_len, which
):
    if which == "version":
        raw, reason = PREFIX.pack(MAGIC, version, 0, 2, 0) + b"{}", "not supported"
    elif which == "flags":
        raw, reason = PREFIX.pack(MAGIC, PROTOCOL_VERSION, flags or 1, 2, 0), "flags must be 0"
    else:  # too large: a header over 64 KiB or any body at all in a request
        header_len = header_len if header_len > MAX_HEADER_BYTES else header_len % 2**10
        body_len = body_len or (1 if header_len <= MAX_HEADER_BYTES else 0)
        raw, reason = PREFIX.pack(MAGIC, PROTOCOL_VERSION, 0, header_len, body_len), "too large"
    started = time.monotonic()
    assert_refused(server, raw, reason)
    assert time.monotonic() - started < 1.0  # refused from the prefix, not after a timeout


@FUZZ
@given(protocol=st.integers(0, pickle.HIGHEST_PROTOCOL), where=st.integers(0, 4))
def test_pickle_payloads_are_never_executed(server, peer_info, protocol, where):
    payload = pickle_payload(protocol)
    raw = [
        payload,  # the whole message
        frame_bytes(payload),  # as the header
        frame_bytes(b'{"type":"get_peer_info"}', payload),  # as a request body
        frame_bytes(json.dumps({"type": payload.decode("latin-1")}).encode()),
        MAGIC + payload,
    ][where]
    assert_refused(server, raw)
    assert not MARKER.exists(), "the side channel executed a pickle payload"
    if where == 0:
        assert_serving(server, peer_info)


def test_the_pickle_payloads_are_live_and_the_module_never_unpickles(tmp_path, monkeypatch):
    """The payloads above really create the file when unpickled: the test above can fail."""
    monkeypatch.setattr(f"{__name__}.MARKER", tmp_path / "ran")
    pickle.loads(pickle_payload(pickle.HIGHEST_PROTOCOL))
    assert (tmp_path / "ran").exists()
    source = Path(side_channel.__file__).read_text()
    assert "pickle" not in source.replace("never pickled", "").replace("unpickled", "")
    assert "eval(" not in source and "exec(" not in source


def test_the_server_keeps_serving_many_good_peers_after_the_fuzzing(server, peer_info):
    served = server.requests_served
    threads = [threading.Thread(target=assert_serving, args=(server, peer_info)) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert server.requests_served == served + 8


# --- the client -------------------------------------------------------------------------------


class FakeOwner:
    """Answers every handshake with `answer` (set per case), then closes."""

    def __init__(self) -> None:
        self.answer = b""
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            with conn:
                try:
                    read_frame(conn, deadline=time.monotonic() + 5)
                    conn.sendall(self.answer)
                    conn.shutdown(socket.SHUT_WR)
                except OSError:
                    pass

    def close(self) -> None:
        self._listener.close()


@pytest.fixture(scope="module")
def fake_owner():
    owner = FakeOwner()
    yield owner
    owner.close()


def _mutated_layouts(peer_info: PeerInfo):
    wire = peer_info.layout.to_wire()
    return st.fixed_dictionaries(
        {key: st.just(value) | json_values for key, value in wire.items()},
        optional={"surprise": json_values},
    ) | st.dictionaries(st.sampled_from(sorted(wire)), json_values, max_size=len(wire))


@FUZZ
@given(data=st.data())
def test_a_garbage_answer_is_a_side_channel_error(fake_owner, peer_info, data):
    kind = data.draw(st.sampled_from(["bytes", "header", "peer_info"]), label="kind")
    if kind == "bytes":
        answer = data.draw(st.binary(max_size=512), label="answer")
    elif kind == "header":
        header = json.dumps(data.draw(json_values, label="header")).encode()
        answer = frame_bytes(header, data.draw(st.binary(max_size=16), label="body"))
    else:
        layout = data.draw(_mutated_layouts(peer_info), label="layout")
        answer_type = data.draw(st.sampled_from(["peer_info", "error", "x"]), label="type")
        agent_name = data.draw(st.just("agent-b") | json_values, label="agent_name")
        header = {"type": answer_type, "agent_name": agent_name, "layout": layout}
        answer = frame_bytes(json.dumps(header).encode(), data.draw(st.binary(max_size=16)))
    fake_owner.answer = answer
    started = time.monotonic()
    try:
        info = fetch_peer_info("127.0.0.1", fake_owner.port, timeout_s=2)
    except SideChannelError as exc:
        assert str(exc).startswith(f"side channel 127.0.0.1:{fake_owner.port}")
    else:  # only a fully valid peer_info may be accepted
        assert kind == "peer_info" and info.layout == KVLayout.from_wire(layout)
    assert time.monotonic() - started < 3
