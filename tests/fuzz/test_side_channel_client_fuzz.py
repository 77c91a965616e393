"""Fuzzes the P2P side channel's client: fetch_peer_info gets garbage answers from a fake owner
and says so as a SideChannelError, accepting only a fully valid peer_info."""

import json
import socket
import threading
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvscope.connector.p2p.transport.layout import KVLayout
from kvscope.connector.p2p.transport.side_channel import (
    PeerInfo,
    SideChannelError,
    fetch_peer_info,
    read_frame,
)
from tests.fuzz.side_channel_frames import FUZZ, frame_bytes, json_values

pytestmark = pytest.mark.timeout(300)


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
