"""Fuzzes the P2P side channel's server: bad frames and requests get a reason, good peers are
still served.

A live SideChannelServer gets random bytes, truncated frames, wrong versions, flags and sizes
and malformed JSON headers (side_channel_frames says how many cases; KVSCOPE_FUZZ_EXAMPLES).
"""

import json
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvscope.connector.p2p.transport.side_channel import (
    MAGIC,
    MAX_HEADER_BYTES,
    PROTOCOL_VERSION,
    Frame,
    PeerInfo,
    encode_frame,
)
from tests.fuzz.side_channel_frames import (
    FUZZ,
    PREFIX,
    assert_refused,
    assert_serving,
    exchange,
    frame_bytes,
    json_values,
)

pytestmark = pytest.mark.timeout(300)


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
    # The client half-closes after the prefix: a server that waited for the rest would answer
    # "connection closed after", so the reason alone says it refused from the prefix.
    assert_refused(server, raw, reason)


def test_the_server_keeps_serving_many_good_peers_after_the_fuzzing(server, peer_info):
    served = server.requests_served
    threads = [threading.Thread(target=assert_serving, args=(server, peer_info)) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert server.requests_served == served + 8
