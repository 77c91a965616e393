"""Blocks move byte-exactly between two NIXL agents (DRAM) in each of vLLM's layouts we serve."""

import pytest
import torch

from kvscope.connector.p2p.transport.nixl_transport import NixlTransport
from kvscope.connector.p2p.transport.results import PeerRejectedError
from kvscope.harness.nixl_peer import FakeKVShape, make_fake_kv_caches

SHAPE = FakeKVShape(num_layers=3, num_blocks=16, num_kv_heads=2, block_size=32, head_dim=16)
REMOTE_IDS, LOCAL_IDS = [15, 0, 7, 8], [2, 5, 6, 0]


def _kv(layout: str, num_blocks: int, seed: int | None) -> dict[str, torch.Tensor]:
    shape = FakeKVShape(**{**SHAPE.__dict__, "kv_layout": layout, "num_blocks": num_blocks})
    return make_fake_kv_caches(shape, seed)


def _agents(prefill: str, decode: str):
    """A prefill owner (random KV) and a decode reader (zeros, fewer blocks), both added."""
    owner_kv, local = _kv(prefill, 16, seed=11), _kv(decode, 8, seed=None)
    owner = NixlTransport("prefill", owner_kv, kv_layout=prefill)
    reader = NixlTransport("decode", local, kv_layout=decode)
    return owner, owner_kv, reader, local


@pytest.mark.parametrize(
    ("prefill", "decode", "descriptors_per_block"),
    [
        ("LBHNC", "LBHNC", 3),
        ("LBNHC", "LBNHC", 3),
        ("BLHNC", "BLHNC", 1),
        ("BLNHC", "BLNHC", 1),
        ("BHLNC", "BHLNC", 1),
        ("BLHNC", "LBHNC", 3),
        ("LBNHC", "BLNHC", 3),
    ],
)
def test_read_blocks_arrive_byte_exact_in_every_layer(prefill, decode, descriptors_per_block):
    owner, owner_kv, reader, local = _agents(prefill, decode)
    with owner, reader:
        info = owner.peer_info()
        peer = reader.add_peer(info.agent_metadata, info.layout)
        (result,) = reader.wait([reader.read_blocks(peer, REMOTE_IDS, LOCAL_IDS)], timeout_s=10)
    assert result.ok, result.cause
    assert result.descriptors == len(LOCAL_IDS) * descriptors_per_block
    assert result.nbytes == len(LOCAL_IDS) * reader.layout.bytes_per_block
    untouched = [b for b in range(8) if b not in LOCAL_IDS]
    for name, view in local.items():  # logical [H, N, C] cells, whatever the physical order
        assert torch.equal(
            view[LOCAL_IDS].view(torch.int16), owner_kv[name][REMOTE_IDS].view(torch.int16)
        ), name
        assert not view[untouched].view(torch.int16).any(), name


def test_sides_ordering_a_page_apart_are_refused_before_any_read():
    owner, _, reader, _ = _agents("LBNHC", "LBHNC")
    with owner, reader:
        info = owner.peer_info()
        with pytest.raises(
            PeerRejectedError,
            match=r"local 'LBHNC', remote 'LBNHC'.*"
            r"set VLLM_KV_CACHE_LAYOUT to the same layout",
        ):
            reader.add_peer(info.agent_metadata, info.layout)
