"""The side-channel fuzz modules' peer and served side channel, one of each per module."""

import pytest

from kvscope.connector.p2p.transport.side_channel import PeerInfo
from tests.fuzz.side_channel_frames import fuzzed_peer_info, fuzzed_server


@pytest.fixture(scope="module")
def peer_info() -> PeerInfo:
    return fuzzed_peer_info()


@pytest.fixture(scope="module")
def server(peer_info):
    with fuzzed_server(peer_info) as server:
        yield server
