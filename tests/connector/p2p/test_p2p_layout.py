"""KV layouts: byte addresses of blocks, the wire form, and the compatibility check."""

import ctypes

import pytest
import torch

from kvscope.connector.p2p.layout import (
    KV_LAYOUT_CUDA,
    KVLayout,
    LayoutMismatchError,
    check_compatible,
)
from kvscope.connector.p2p.peer_process import FakeKVShape, make_fake_kv_caches

SHAPE = FakeKVShape(num_layers=3, num_blocks=10, num_kv_heads=2, block_size=32, head_dim=16)


def _bytes_at(address: int, length: int) -> bytes:
    return ctypes.string_at(address, length)


def test_descriptors_point_at_each_layers_block():
    kv_caches = make_fake_kv_caches(SHAPE, seed=3)
    layout = KVLayout.from_layer_tensors("prefill", kv_caches)
    descs = layout.descriptor_array()
    assert len(descs) == SHAPE.num_layers * SHAPE.num_blocks
    for layer, tensor in enumerate(kv_caches.values()):
        for block_id in (0, 7, 9):
            addr, length, _ = descs[layer * layout.num_blocks + block_id]
            expected = tensor[block_id].contiguous().view(torch.uint8).numpy().tobytes()
            assert _bytes_at(int(addr), int(length)) == expected
    assert layout.bytes_per_block == SHAPE.num_layers * 2 * 32 * 32 * 2
    assert (layout.block_size, layout.num_kv_heads, layout.head_dim) == (32, 2, 16)


def test_views_of_one_storage_register_as_one_region():
    layout = KVLayout.from_layer_tensors("prefill", make_fake_kv_caches(SHAPE, seed=None))
    ((start, length),) = layout.registration_regions()
    assert start == min(layout.plane_base_addrs)
    assert length == SHAPE.num_layers * SHAPE.num_blocks * layout.plane_bytes_per_block


def test_cuda_layout_has_key_and_value_planes():
    kv_caches = {f"l{i}": torch.zeros(2, 8, 16, 4, 32, dtype=torch.float16) for i in range(2)}
    layout = KVLayout.from_layer_tensors("decode", kv_caches)
    assert layout.kv_layout == KV_LAYOUT_CUDA and layout.planes_per_layer == 2
    assert layout.plane_base_addrs[1] == kv_caches["l0"][1].data_ptr()
    assert layout.bytes_per_block_per_layer == 2 * 16 * 4 * 32 * 2
    assert len(layout.registration_regions()) == 2  # separate allocations stay separate


def test_wire_form_round_trips_and_rejects_bad_fields():
    layout = KVLayout.from_layer_tensors("prefill", make_fake_kv_caches(SHAPE, seed=None))
    assert KVLayout.from_wire(layout.to_wire()) == layout
    for bad in (
        {**layout.to_wire(), "num_blocks": "10"},
        {**layout.to_wire(), "plane_base_addrs": [1]},
        {**layout.to_wire(), "evil": 1},
        [1, 2],
    ):
        with pytest.raises(ValueError):
            KVLayout.from_wire(bad)


def test_mismatch_names_what_differs_and_what_to_change():
    local = KVLayout.from_layer_tensors("decode", make_fake_kv_caches(SHAPE, seed=None))
    other_block_size = FakeKVShape(num_layers=3, num_blocks=10, block_size=64, head_dim=16)
    remote = KVLayout.from_layer_tensors("prefill", make_fake_kv_caches(other_block_size, None))
    with pytest.raises(LayoutMismatchError, match=r"block_size in tokens: local 32, remote 64"):
        check_compatible(local, remote)
    halves = {k: v.to(torch.float16) for k, v in make_fake_kv_caches(SHAPE, seed=None).items()}
    with pytest.raises(LayoutMismatchError, match=r"dtype.*--kv-cache-dtype"):
        check_compatible(local, KVLayout.from_layer_tensors("prefill", halves))


def test_block_mapping_handles_different_cache_sizes():
    local = KVLayout.from_layer_tensors("decode", make_fake_kv_caches(SHAPE, seed=None))
    bigger = FakeKVShape(num_layers=3, num_blocks=25, num_kv_heads=2, block_size=32, head_dim=16)
    remote = KVLayout.from_layer_tensors("prefill", make_fake_kv_caches(bigger, seed=None))
    local_idx, remote_idx = check_compatible(local, remote).descriptor_ids([1, 2], [20, 3])
    assert local_idx.tolist() == [1, 2, 11, 12, 21, 22]
    assert remote_idx.tolist() == [20, 3, 45, 28, 70, 53]
    with pytest.raises(ValueError, match=r"remote block ids must lie in \[0, 25\)"):
        check_compatible(local, remote).descriptor_ids([1], [25])
