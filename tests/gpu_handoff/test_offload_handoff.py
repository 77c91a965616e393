"""The offload connector (untraced, traced, inside a Multi) over every CUDA backend's hand-off.

For each backend x model kind x block size x KV dtype the installed vLLM (0.32 or 0.34) would
start on CUDA, the connector registers the views a GPU worker hands it (kernel-block views
included), stores a request's blocks, and after every KV byte is clobbered loads them back for a
second request with the same prompt: each loaded block holds the first request's bytes exactly,
blocks the second request computed hold its own, and every other block is untouched.
"""

import pytest

pytest.importorskip("vllm")

from tests.gpu_handoff import backends  # noqa: E402
from tests.gpu_handoff.builder import build_worker_kv_caches, case_id, handoff_cases  # noqa: E402
from tests.gpu_handoff.offload_checks import (  # noqa: E402
    assert_loaded_exactly,
    prompt,
    stored_and_clobbered,
)
from tests.gpu_handoff.planning import plan_kv_cache_configs  # noqa: E402
from tests.gpu_handoff.stepper import (  # noqa: E402
    CONNECTORS,
    HandOffEngine,
    offload_transfer_config,
)

CASES = handoff_cases()


def stored_then_clobbered(tiny_model, case, setup: str, **build) -> HandOffEngine:
    """r1's prompt computed and stored, vLLM's prefix cache emptied, every KV byte clobbered."""
    backend, kind, block_size, dtype = case
    handoff = build_worker_kv_caches(
        backend,
        kind,
        block_size,
        dtype,
        num_blocks=16,
        model=tiny_model,
        kv_transfer_config=offload_transfer_config(setup),
        **build,
    )
    return stored_and_clobbered(HandOffEngine(handoff))


@pytest.mark.parametrize("setup", CONNECTORS)
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_blocks_load_back_byte_exactly_through_the_gpu_views(tiny_model, case, setup):
    engine = stored_then_clobbered(tiny_model, case, setup)
    engine.add("r2", prompt(case[2]))
    engine.run_until_idle()
    assert_loaded_exactly(engine)


SHARING_CASES = [
    ("FLASH_ATTN", "full", 16, "auto"),
    ("FLASHINFER", "hybrid", 128, "auto"),
    ("FLASHMLA", "mla", 64, "fp8"),
]


@pytest.mark.parametrize("setup", CONNECTORS)
@pytest.mark.parametrize("case", SHARING_CASES, ids=case_id)
def test_kv_sharing_layers_are_copied_once_and_both_halves_agree_on_the_pool(
    tiny_model, case, setup
):
    """vLLM aliases KV-sharing layers into the dict after the connector is built: the worker
    must size host blocks as the scheduler half does (which never sees those layers)."""
    engine = stored_then_clobbered(tiny_model, case, setup, num_shared_layers=2)
    assert len(engine.handoff.kv_caches) == len(engine.handoff.shared_layers) + sum(
        len(layers) for layers in engine.group_layers
    )
    engine.add("r2", prompt(case[2]))
    engine.run_until_idle()
    assert_loaded_exactly(engine)


LAYOUTS = ("LBHNC", "LBNHC", "LHBNC", "BLHNC", "BLNHC", "BHLNC")
"""Every layout vLLM 0.32 can resolve: the connector's own LBHNC, CUDA's default LBNHC, P2P's
BLNHC (beside it in a Multi), and any VLLM_KV_CACHE_LAYOUT a user sets."""
LAYOUT_CASES = [
    ("FLASH_ATTN", "full", 16, "auto"),
    ("FLASHINFER", "full", 128, "auto"),
    ("TRITON_ATTN", "hybrid", 64, "fp8"),
    ("FLASH_ATTN", "sliding_window", 32, "auto"),
    ("FLASHMLA", "mla", 128, "auto"),
]


@pytest.mark.parametrize("setup", CONNECTORS)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("case", LAYOUT_CASES, ids=case_id)
def test_every_layout_vllm_resolves_loads_back_byte_exactly(tiny_model, case, layout, setup):
    declared = backends.backend(case[0]).kv_cache_layouts
    if declared is not None and layout not in declared:
        # vLLM 0.34's FlashInfer names no LHBNC page: vLLM refuses the setting outright.
        with pytest.raises(ValueError, match=f"VLLM_KV_CACHE_LAYOUT={layout} does not satisfy"):
            stored_then_clobbered(tiny_model, case, setup, layout=layout)
        return
    if case[:3] == ("FLASHINFER", "full", 128) and layout == "LHBNC":
        # vLLM itself refuses to split LHBNC's interleaved blocks into kernel blocks.
        with pytest.raises(ValueError, match="Reduce --block-size to 64"):
            stored_then_clobbered(tiny_model, case, setup, layout=layout)
        return
    engine = stored_then_clobbered(tiny_model, case, setup, layout=layout)
    assert engine.handoff.layout == layout
    engine.add("r2", prompt(case[2]))
    engine.run_until_idle()
    assert_loaded_exactly(engine)


def refused_config(tiny_model, setup: str, other_spec: str):
    """A hand-off's configs with a second group the offload connector cannot keep."""
    import torch
    from vllm.v1.kv_cache_interface import ChunkedLocalAttentionSpec, FullAttentionSpec

    handoff = build_worker_kv_caches(
        "FLASH_ATTN",
        "full",
        16,
        model=tiny_model,
        kv_transfer_config=offload_transfer_config(setup),
    )
    full = handoff.kv_cache_config.kv_cache_groups[0].kv_cache_spec
    if other_spec == "chunked_local":
        other = ChunkedLocalAttentionSpec(
            block_size=16,
            num_kv_heads=2,
            head_size=64,
            dtype=torch.bfloat16,
            attention_chunk_size=64,
        )
    else:  # the same page in blocks of 32 tokens: half the heads
        other = FullAttentionSpec(block_size=32, num_kv_heads=1, head_size=64, dtype=full.dtype)
    specs = {"model.layers.0.self_attn.attn": full, "model.layers.1.self_attn.attn": other}
    [config] = plan_kv_cache_configs(handoff.vllm_config, [specs], [1 << 40])
    assert len(config.kv_cache_groups) == 2
    return handoff.vllm_config, config


@pytest.mark.parametrize("setup", CONNECTORS)
@pytest.mark.parametrize(
    ("other_spec", "what_to_change"),
    [("chunked_local", "--disable-hybrid-kv-cache-manager"), ("block_size", "--block-size")],
)
def test_a_group_the_connector_cannot_keep_is_refused_at_start_saying_what_to_change(
    tiny_model, setup, other_spec, what_to_change
):
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

    vllm_config, config = refused_config(tiny_model, setup, other_spec)
    for role in (KVConnectorRole.SCHEDULER, KVConnectorRole.WORKER):
        with pytest.raises(ValueError, match=what_to_change):
            KVConnectorFactory.create_connector(vllm_config, role, config)


CUDA_PREFERENCE_CASES = [
    (("FLASH_ATTN", "full", 16, "auto"), "LBHNC"),
    (("FLASHINFER", "hybrid", 128, "auto"), "LBHNC"),
    (("TRITON_ATTN", "sliding_window", 64, "fp8"), "LBHNC"),
    (("FLEX_ATTENTION", "full", 64, "auto"), "LBNHC"),  # Flex reads only LBNHC: vLLM says so
]


@pytest.mark.parametrize("setup", CONNECTORS)
@pytest.mark.parametrize(
    ("case", "expected"),
    CUDA_PREFERENCE_CASES,
    ids=lambda c: case_id(c) if isinstance(c, tuple) else c,
)
def test_the_layout_vllm_resolves_for_the_connector_on_cuda(tiny_model, case, expected, setup):
    """The connector asks for LBHNC on CUDA-alike devices (none on the CPU platform): vLLM's
    resolution takes it where the backend can read it, through the Multi too."""
    from vllm.platforms import current_platform

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(current_platform, "is_cpu", lambda: False)
        engine = stored_then_clobbered(tiny_model, case, setup)
    assert engine.handoff.layout == expected
    engine.add("r2", prompt(case[2]))
    engine.run_until_idle()
    assert_loaded_exactly(engine)
