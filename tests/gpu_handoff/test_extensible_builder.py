"""The extensible hand-off is what vLLM 0.34's extend_kv_cache gives a connector.

The connector's config has the committed block count and committed_kv_cache_tensors; the views
span committed bytes only, at the reservation's fixed addresses; segments are one physical chunk
each only where the connector registers the memory; LHBNC and BHLNC are refused with a
connector. The harness's steps are held to extend_kv_cache's own source, in its order.
"""

import ast
import inspect

import pytest

pytest.importorskip("vllm")

from tests.gpu_handoff.builder import LAYER_NAME  # noqa: E402
from tests.gpu_handoff.extensible import (  # noqa: E402
    EXTENSIBLE_KV_CACHE,
    MIN_COMMITTED_BLOCKS,
    NO_EXTENSIBLE_KV_CACHE,
    committed_segment_bytes,
)
from tests.gpu_handoff.stepper import offload_transfer_config  # noqa: E402

pytestmark = pytest.mark.skipif(not EXTENSIBLE_KV_CACHE, reason=NO_EXTENSIBLE_KV_CACHE)

OFFLOAD = offload_transfer_config("core")
CASES = [("FLASH_ATTN", "full", 16, "auto"), ("FLASHINFER", "hybrid", 256, "fp8")]


def p2p_config():
    from tests.gpu_handoff.p2p_pair import p2p_transfer_config

    return p2p_transfer_config("core", "extensible", 5600)


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_a_connector_that_copies_in_process_gets_segments_of_several_chunks(
    extensible_handoff, case
):
    handoff = extensible_handoff(*case, kv_transfer_config=OFFLOAD)
    kv_cache = handoff.extensible_kv_cache
    assert handoff.layout == "LBHNC" and len(kv_cache.segment_strides) > 1  # one per layer
    assert not any(kv_cache.buffer.segments_backed_by_one_chunk(committed_segment_bytes(handoff)))
    assert kv_cache.buffer.num_physical_chunks >= 3 * len(kv_cache.segment_strides)


@pytest.mark.parametrize("layout", [None, "LBNHC"])
def test_a_connector_that_registers_the_memory_gets_one_chunk_per_segment(
    extensible_handoff, layout
):
    handoff = extensible_handoff(
        "FLASH_ATTN", "full", 64, kv_transfer_config=p2p_config(), layout=layout
    )
    kv_cache = handoff.extensible_kv_cache
    segments = len(kv_cache.segment_strides)
    assert handoff.layout == (layout or "BLNHC") and segments == (2 if layout else 1)
    assert all(kv_cache.buffer.segments_backed_by_one_chunk(committed_segment_bytes(handoff)))
    assert kv_cache.buffer.num_physical_chunks == segments


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_the_connector_config_and_views_cover_the_committed_blocks_only(extensible_handoff, case):
    handoff = extensible_handoff(*case, kv_transfer_config=OFFLOAD, num_shared_layers=1)
    kv_cache = handoff.extensible_kv_cache
    committed = handoff.num_blocks
    assert MIN_COMMITTED_BLOCKS <= committed == kv_cache.num_committed_blocks
    assert kv_cache.capacity_blocks == 2 * committed
    assert handoff.scheduler_kv_cache_config.num_blocks == committed
    # Layer-outer: one single-layer tensor per layer memory, placed at its storage's start.
    tensors = handoff.kv_cache_config.kv_cache_tensors
    owning = [
        name for group in handoff.kv_cache_config.kv_cache_groups for name in group.layer_names
    ]
    assert sorted(name for t in tensors for name in t.layers) == sorted(owning)
    assert all(len(t.layers) == 1 and t.offset == 0 for t in tensors)
    for tensor in tensors:
        (layer_name,) = tensor.layers
        view = handoff.kv_caches[layer_name]
        assert view.untyped_storage().nbytes() == committed * tensor.block_stride
        assert view.shape[0] == committed * handoff.blocks_per_kv_block
    # The views sit where vLLM reserved them; the KV-sharing alias is its target's view.
    base = kv_cache.buffer.base_ptr
    starts = {handoff.kv_caches[name].data_ptr() - base for name in owning}
    assert starts == {offset for offset in kv_cache.segment_offsets}
    for layer_name, target in handoff.shared_layers.items():
        assert handoff.kv_caches[layer_name] is handoff.kv_caches[target]


def test_block_outer_views_share_one_storage_of_the_committed_blocks(extensible_handoff):
    handoff = extensible_handoff("FLASH_ATTN", "full", 64, kv_transfer_config=p2p_config())
    views = [handoff.kv_caches[LAYER_NAME.format(i)] for i in range(2)]
    [tensor] = handoff.kv_cache_config.kv_cache_tensors
    assert {view.untyped_storage().data_ptr() for view in views} == {
        handoff.extensible_kv_cache.buffer.base_ptr
    }
    assert views[0].untyped_storage().nbytes() == handoff.num_blocks * tensor.block_stride


@pytest.mark.parametrize("layout", ["LHBNC", "BHLNC"])
@pytest.mark.parametrize("connector", ["offload", "p2p"])
def test_layouts_that_are_not_block_compact_are_refused_with_a_connector(
    extensible_handoff, tiny_model, layout, connector
):
    """vLLM commits a layer's blocks as one run only under block-compact layouts."""
    from tests.gpu_handoff.builder import build_worker_kv_caches
    from tests.gpu_handoff.engine_core import plan_engine

    config = OFFLOAD if connector == "offload" else p2p_config()
    with pytest.raises(ValueError, match=f"VLLM_KV_CACHE_LAYOUT={layout} does not satisfy"):
        extensible_handoff("FLASH_ATTN", "full", 16, kv_transfer_config=config, layout=layout)
    # Without a connector, or without the extensible cache, vLLM takes it.
    plan = plan_engine(
        "FLASH_ATTN",
        "full",
        16,
        "auto",
        32,
        2,
        model=tiny_model,
        kv_transfer_config=None,
        num_shared_layers=0,
        tensor_parallel_size=1,
        layout=layout,
        extensible=True,
    )
    assert plan.layout.name == layout
    if connector == "offload":
        handoff = build_worker_kv_caches(
            "FLASH_ATTN", "full", 16, model=tiny_model, kv_transfer_config=config, layout=layout
        )
        assert handoff.layout == layout


def test_the_harness_follows_extend_kv_cache_in_its_order():
    """The calls of vLLM's extend_kv_cache that concern the connector, in their order: a vLLM
    that reorders or drops one fails here, and extensible.py must follow it."""
    from vllm.v1.worker import extensible_kv_cache

    tree = ast.parse(inspect.getsource(extensible_kv_cache.extend_kv_cache))
    calls = [
        node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        for node in sorted(
            (n for n in ast.walk(tree) if isinstance(n, ast.Call)),
            key=lambda n: (n.lineno, n.col_offset),
        )
    ]
    steps = [
        "committed_kv_cache_tensors",
        "ensure_kv_transfer_initialized",
        "commit",
        "registers_kv_cache_memory",
        "committed_views",
        "bind_kv_caches",
        "get_kv_connector",
    ]
    positions = [calls.index(step) for step in steps]
    assert positions == sorted(positions), calls
