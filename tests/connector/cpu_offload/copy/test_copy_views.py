"""bench/transfer/kv_views.py (torch only) builds the views vLLM's create_kv_cache_views builds."""

import pytest
import torch

from kvscope.bench.transfer.kv_views import LAYOUT_ORDERS, KVShape, kv_views

interface = pytest.importorskip("vllm.v1.kv_cache_interface")
kv_cache_layout = pytest.importorskip("vllm.v1.kv_cache_layout")

SHAPES = [
    KVShape(),
    KVShape(num_layers=4, num_blocks=10, num_kv_heads=8, head_size=128),
    KVShape(num_layers=2, num_blocks=7, block_size=64, dtype=torch.float16),
]


def vllm_views(raw: torch.Tensor, kv: KVShape, layout_name: str, kernel: int | None):
    spec = interface.FullAttentionSpec(
        block_size=kv.block_size,
        num_kv_heads=kv.num_kv_heads,
        head_size=kv.head_size,
        dtype=kv.dtype,
    )
    layout = kv_cache_layout.KVCacheLayout[layout_name]
    strides = interface.compute_layout_strides(spec, kv.num_blocks, kv.num_layers, layout)
    names = [f"model.layers.{n}.self_attn" for n in range(kv.num_layers)]
    tensor = interface.KVCacheTensor(
        size=raw.numel(), layers=names, layer_stride=strides[0], block_stride=strides[1]
    )
    return interface.create_kv_cache_views(raw, spec, kv.num_blocks, layout, tensor, kernel)


def described(views: list[torch.Tensor]) -> list[tuple]:
    return [(v.shape, v.stride(), v.storage_offset(), v.dtype) for v in views]


@pytest.mark.parametrize("kernel", [None, 16])
@pytest.mark.parametrize("layout", list(LAYOUT_ORDERS))
@pytest.mark.parametrize("kv", SHAPES, ids=["small", "llama8b-like", "fp16-64"])
def test_the_torch_only_views_are_vllms_views(layout, kernel, kv):
    assert set(LAYOUT_ORDERS) == {member.name for member in kv_cache_layout.KVCacheLayout}
    assert all(
        LAYOUT_ORDERS[member.name] == member.value for member in kv_cache_layout.KVCacheLayout
    ), "the stride orders are vLLM's"
    raw = torch.zeros(kv.nbytes, dtype=torch.int8)
    try:
        theirs = described(vllm_views(raw, kv, layout, kernel))
    except ValueError:  # vLLM cannot split pages that are not dense
        with pytest.raises(ValueError, match="dense"):
            kv_views(raw, kv, layout, kernel)
        return
    assert described(kv_views(raw, kv, layout, kernel)) == theirs
