"""Fuzzes the P2P side channel with pickle payloads: refused wherever they are put, never run."""

import json
import pickle
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvscope.connector.p2p.transport import side_channel
from kvscope.connector.p2p.transport.side_channel import MAGIC
from tests.fuzz import side_channel_frames
from tests.fuzz.side_channel_frames import (
    FUZZ,
    assert_refused,
    assert_serving,
    frame_bytes,
    pickle_payload,
)

pytestmark = pytest.mark.timeout(300)


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
    assert not side_channel_frames.MARKER.exists(), "the side channel executed a pickle payload"
    if where == 0:
        assert_serving(server, peer_info)


def test_the_pickle_payloads_are_live_and_the_module_never_unpickles(tmp_path, monkeypatch):
    """The payloads above really create the file when unpickled: the test above can fail."""
    monkeypatch.setattr(side_channel_frames, "MARKER", tmp_path / "ran")
    pickle.loads(pickle_payload(pickle.HIGHEST_PROTOCOL))
    assert (tmp_path / "ran").exists()
    source = Path(side_channel.__file__).read_text()
    assert "pickle" not in source.replace("never pickled", "").replace("unpickled", "")
    assert "eval(" not in source and "exec(" not in source
