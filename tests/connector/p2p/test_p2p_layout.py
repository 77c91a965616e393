"""KV layouts from vLLM's own views (every KVCacheLayout): exact block bytes, wire form, checks."""

from types import SimpleNamespace

import pytest
import torch
from vllm.v1.kv_cache_layout import KVCacheLayout

from kvscope.connector.common.kv_layout import KVLayoutError
from kvscope.connector.p2p.transport.layout import KVLayout, LayoutMismatchError, check_compatible
from kvscope.harness.nixl_peer import FakeKVShape, make_fake_kv_caches

SHAPE = FakeKVShape(num_layers=3, num_blocks=10, num_kv_heads=2, block_size=32, head_dim=16)
SUPPORTED = ("LBHNC", "LBNHC", "BLHNC", "BLNHC", "BHLNC")


def _shape(layout: str, **changes) -> FakeKVShape:
    return FakeKVShape(**{**SHAPE.__dict__, "kv_layout": layout, **changes})


def _byte_addresses(view: torch.Tensor) -> list[int]:
    """Every byte address the view's elements occupy, sorted (from its strides alone)."""
    es = view.element_size()
    offsets = torch.zeros((), dtype=torch.int64)
    for size, stride in zip(view.shape, view.stride(), strict=True):
        offsets = offsets[..., None] + torch.arange(size) * stride
    starts = view.data_ptr() + offsets.flatten() * es
    return sorted((starts[:, None] + torch.arange(es)).flatten().tolist())


def _run(desc) -> list[int]:
    addr, length, _ = (int(x) for x in desc)
    return list(range(addr, addr + length))


@pytest.mark.parametrize("name", SUPPORTED)
def test_descriptors_cover_exactly_each_blocks_bytes(name):
    kv_caches = make_fake_kv_caches(_shape(name), seed=3)
    views = list(kv_caches.values())
    layout = KVLayout.from_layer_tensors("prefill", kv_caches, kv_layout=KVCacheLayout[name])
    vllm_layout = KVCacheLayout[name]
    assert layout.page_runs == vllm_layout.is_block_compact
    assert layout.block_runs == vllm_layout.is_block_outermost
    assert (layout.block_size, layout.num_kv_heads, layout.head_dim) == (32, 2, 16)
    assert layout.bytes_per_block == SHAPE.num_layers * 2 * 32 * 32 * 2
    for block_id in (0, 7, 9):
        if layout.page_runs:
            pages = layout.descriptor_array(per_block=False)
            for layer, view in enumerate(views):
                desc = pages[layer * layout.num_blocks + block_id]
                assert _run(desc) == _byte_addresses(view[block_id]), (layer, block_id)
        if layout.block_runs:
            desc = layout.descriptor_array(per_block=True)[block_id]
            every_layer = sorted(a for view in views for a in _byte_addresses(view[block_id]))
            assert _run(desc) == every_layer


def test_the_layout_vllm_cannot_store_as_runs_is_refused_with_what_to_set():
    kv_caches = make_fake_kv_caches(_shape("LHBNC"), seed=None)
    with pytest.raises(KVLayoutError, match=r"LHBNC.*VLLM_KV_CACHE_LAYOUT.*LBHNC, LBNHC"):
        KVLayout.from_layer_tensors("prefill", kv_caches, kv_layout="LHBNC")


def test_views_must_match_the_layout_vllm_resolved():
    kv_caches = make_fake_kv_caches(_shape("LBNHC"), seed=None)
    with pytest.raises(KVLayoutError, match=r"not as LBHNC"):
        KVLayout.from_layer_tensors("prefill", kv_caches, kv_layout="LBHNC")
    assert KVLayout.from_layer_tensors("p", kv_caches).kv_layout == "LBNHC"  # from strides
    assert KVLayout.from_layer_tensors("p", kv_caches, kv_layout="NHD").kv_layout == "LBNHC"


def test_layers_allocated_apart_are_layer_outermost_in_any_address_order():
    memories = [torch.zeros(10, 2, 32, 32, dtype=torch.bfloat16) for _ in range(3)]
    for order in (memories, memories[::-1], [memories[1], memories[0], memories[2]]):
        kv_caches = {f"layer.{i}": memory for i, memory in enumerate(order)}
        assert KVLayout.from_layer_tensors("p", kv_caches).kv_layout == "LBHNC"


def test_kvcache_tensor_strides_are_checked():
    kv_caches = make_fake_kv_caches(_shape("BLHNC"), seed=None)
    page = 2 * 32 * 32 * 2
    layout = KVLayout.from_layer_tensors("p", kv_caches, tensor_strides=(page, 3 * page))
    assert layout.block_stride_bytes == 3 * page
    with pytest.raises(KVLayoutError, match="differ from vLLM's KVCacheTensor"):
        KVLayout.from_layer_tensors("p", kv_caches, tensor_strides=(10 * page, page))


def test_kernel_blocks_fold_into_the_managers_blocks():
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        KVCacheTensor,
        compute_layout_strides,
        create_kv_cache_views,
    )

    spec = FullAttentionSpec(block_size=64, num_kv_heads=2, head_size=16, dtype=torch.bfloat16)
    layer_stride, block_stride, *_ = compute_layout_strides(spec, 6, 2, KVCacheLayout.LBHNC)
    tensor = KVCacheTensor(
        size=12 * spec.page_size_bytes,
        layers=["a", "b"],
        layer_stride=layer_stride,
        block_stride=block_stride,
    )
    raw = torch.zeros(tensor.size, dtype=torch.int8)
    views = create_kv_cache_views(raw, spec, 6, KVCacheLayout.LBHNC, tensor, kernel_block_size=32)
    assert views[0].shape[0] == 12  # kernel blocks of 32 tokens
    layout = KVLayout.from_layer_tensors(
        "p",
        dict(zip("ab", views, strict=True)),
        kv_layout="LBHNC",
        num_blocks=6,
        tensor_strides=(layer_stride, block_stride),
    )
    assert (layout.num_blocks, layout.block_size) == (6, 64)
    desc = layout.descriptor_array(per_block=False)[6 + 4]  # layer b, manager block 4
    assert _run(desc) == sorted(_byte_addresses(views[1][8]) + _byte_addresses(views[1][9]))


def _layout(name: str, **changes) -> KVLayout:
    kv_caches = make_fake_kv_caches(_shape(name, **changes), seed=None)
    return KVLayout.from_layer_tensors(name, kv_caches, kv_layout=name)


@pytest.mark.parametrize(
    ("local", "remote", "per_block"),
    [
        ("BLHNC", "BLHNC", True),
        ("BLNHC", "BLNHC", True),
        ("BHLNC", "BHLNC", True),
        ("LBHNC", "LBHNC", False),
        ("LBHNC", "BLHNC", False),
        ("BLNHC", "LBNHC", False),
    ],
)
def test_sides_trade_whole_blocks_when_both_store_them_alike(local, remote, per_block):
    mapping = check_compatible(_layout(local), _layout(remote))
    assert mapping.per_block is per_block
    assert mapping.descriptors_per_block == (1 if per_block else SHAPE.num_layers)


@pytest.mark.parametrize(("local", "remote"), [("LBHNC", "LBNHC"), ("BLHNC", "BHLNC")])
def test_sides_that_order_a_block_differently_are_refused(local, remote):
    with pytest.raises(
        LayoutMismatchError,
        match=rf"local '{local}', remote '{remote}'.*"
        r"VLLM_KV_CACHE_LAYOUT",
    ):
        check_compatible(_layout(local), _layout(remote))


def test_wire_form_round_trips_and_rejects_bad_fields():
    layout = _layout("BLNHC")
    assert KVLayout.from_wire(layout.to_wire()) == layout
    for bad in (
        {**layout.to_wire(), "num_blocks": "10"},
        {**layout.to_wire(), "layer_base_addrs": [1]},
        {**layout.to_wire(), "kv_layout": "XYZ"},
        {**layout.to_wire(), "block_runs": 1},
        {**layout.to_wire(), "page_runs": False, "block_runs": False},
        {**layout.to_wire(), "num_blocks": 2**40},
        {**layout.to_wire(), "evil": 1},
        [1, 2],
    ):
        with pytest.raises(ValueError):
            KVLayout.from_wire(bad)


def test_mismatch_names_what_differs_and_what_to_change():
    with pytest.raises(LayoutMismatchError, match=r"block_size in tokens: local 32, remote 64"):
        check_compatible(_layout("LBHNC"), _layout("LBHNC", block_size=64))


def test_block_mapping_handles_different_cache_sizes():
    local, remote = _layout("LBHNC"), _layout("LBHNC", num_blocks=25)
    local_idx, remote_idx = check_compatible(local, remote).descriptor_ids([1, 2], [20, 3])
    assert local_idx.tolist() == [1, 2, 11, 12, 21, 22]
    assert remote_idx.tolist() == [20, 3, 45, 28, 70, 53]
    with pytest.raises(ValueError, match=r"remote block ids must lie in \[0, 25\)"):
        check_compatible(local, remote).descriptor_ids([1], [25])


def test_vllm_resolves_the_connectors_preferred_layout(monkeypatch):
    """vLLM's own resolve_kv_cache_layout asks the connector class, as it asks stock NIXL."""
    from vllm.config import CacheConfig, KVTransferConfig
    from vllm.v1.attention.backends.utils import resolve_kv_cache_layout

    from kvscope.connector.p2p import vllm_layout

    def resolve(extra: dict, supported: list[str]) -> str:
        ktc = KVTransferConfig(
            kv_connector="P2PConnector",
            kv_role="kv_both",
            kv_connector_module_path="kvscope.connector.p2p.connector",
            kv_connector_extra_config=extra,
        )
        config = SimpleNamespace(
            cache_config=CacheConfig(),
            kv_transfer_config=ktc,
            model_config=SimpleNamespace(use_mla=False),
        )
        return resolve_kv_cache_layout(config, [supported]).name

    every = [layout.name for layout in KVCacheLayout]
    assert resolve({}, ["LBHNC"]) == "LBHNC"  # the CPU platform: no preference stated
    monkeypatch.setattr(vllm_layout, "_platform_is_cpu", lambda: False)
    assert resolve({}, ["LBNHC", "LBHNC", "BLNHC", "BLHNC"]) == "BLNHC"
    assert resolve({"kv_cache_layout": "BLHNC"}, every) == "BLHNC"
    assert resolve({"kv_cache_layout": "none"}, ["LBNHC", "BLNHC"]) == "LBNHC"
