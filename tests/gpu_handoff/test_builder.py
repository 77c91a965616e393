"""The hand-off builder gives what vLLM's GPU worker would: its layout, groups, views, aliases."""

import pytest

pytest.importorskip("vllm")

from tests.gpu_handoff.builder import LAYER_NAME, build_worker_kv_caches  # noqa: E402


def test_kernel_block_views_have_ratio_rows_per_kv_block(tiny_model):
    handoff = build_worker_kv_caches("FLASHINFER", "full", 256, num_blocks=8, model=tiny_model)
    assert handoff.kernel_block_sizes == (64,) and handoff.blocks_per_kv_block == 4
    assert {tuple(v.shape) for v in handoff.kv_caches.values()} == {(32, 2, 64, 128)}
    assert handoff.layout == "LBNHC"  # CUDA's default: no connector asked for one


def test_a_hybrid_model_overlays_its_two_groups_on_one_memory_per_layer(tiny_model):
    handoff = build_worker_kv_caches("FLASH_ATTN", "hybrid", 32, model=tiny_model)
    full, window = (g.layer_names for g in handoff.kv_cache_config.kv_cache_groups)
    assert len(full) == len(window) == 2
    for full_layer, window_layer in zip(full, window, strict=True):
        assert (
            handoff.kv_caches[full_layer].data_ptr() == handoff.kv_caches[window_layer].data_ptr()
        )


def test_kv_sharing_layers_alias_their_target_and_only_the_runner_lists_them(tiny_model):
    handoff = build_worker_kv_caches("FLASHMLA", "mla", 64, num_shared_layers=2, model=tiny_model)
    assert handoff.shared_layers == {
        LAYER_NAME.format(2): LAYER_NAME.format(1),
        LAYER_NAME.format(3): LAYER_NAME.format(0),
    }
    for layer, target in handoff.shared_layers.items():
        assert handoff.kv_caches[layer] is handoff.kv_caches[target]
        assert layer in handoff.runner_kv_cache_config.kv_cache_groups[0].layer_names
        assert layer not in handoff.kv_cache_config.kv_cache_groups[0].layer_names
        assert layer not in handoff.scheduler_kv_cache_config.kv_cache_groups[0].layer_names


def test_mla_views_hold_one_latent_per_token_and_fp8_is_bytes(tiny_model):
    handoff = build_worker_kv_caches("FLASHMLA", "mla", 64, "fp8", model=tiny_model)
    view = handoff.kv_caches[LAYER_NAME.format(0)]
    assert tuple(view.shape[1:]) == (1, 64, 576) and view.element_size() == 1


def test_a_forced_layout_is_what_the_views_have(tiny_model):
    from kvscope.connector.p2p.transport.geometry import identify_layout

    for layout in ("LBHNC", "BLNHC"):
        handoff = build_worker_kv_caches("TRITON_ATTN", "full", 32, model=tiny_model, layout=layout)
        assert identify_layout(list(handoff.kv_caches.values())) == layout == handoff.layout


def test_what_vllm_would_refuse_is_refused(tiny_model):
    with pytest.raises(ValueError, match="FLEX_ATTENTION takes KV cache dtypes"):
        build_worker_kv_caches("FLEX_ATTENTION", "full", 32, "fp8", model=tiny_model)
    with pytest.raises(ValueError, match="No common block size"):
        build_worker_kv_caches("CUTLASS_MLA", "mla", 64, model=tiny_model)
