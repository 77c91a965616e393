"""The offload connector over vLLM 0.34's extensible KV cache, as extend_kv_cache hands it over.

Its views span only committed bytes, one storage per layer memory under layer-outer layouts,
over segments of several physical chunks (the connector copies in process, so vLLM does not
defragment): blocks load back byte-exactly and every other block is untouched, for every
backend x model kind x block size x KV dtype, every layout vLLM allows with a connector, the
traced connector and the Multi, and KV-sharing aliases.
"""

import pytest

pytest.importorskip("vllm")

from tests.gpu_handoff.builder import case_id, handoff_cases  # noqa: E402
from tests.gpu_handoff.extensible import committed_segment_bytes  # noqa: E402
from tests.gpu_handoff.offload_checks import (  # noqa: E402
    assert_loaded_exactly,
    prompt,
    stored_and_clobbered,
)
from tests.gpu_handoff.stepper import CONNECTORS, HandOffEngine, offload_transfer_config  # noqa: E402

COMPACT_LAYOUTS = ("LBHNC", "LBNHC", "BLHNC", "BLNHC")
"""The block-compact layouts: what vLLM resolves with the extensible cache and a connector."""
LAYOUT_CASES = [
    ("FLASH_ATTN", "full", 16, "auto"),
    ("FLASHINFER", "hybrid", 256, "fp8"),
    ("FLASHMLA", "mla", 128, "auto"),
]


def loaded_back(extensible_handoff, case, setup: str, **build) -> HandOffEngine:
    """r1 stored and clobbered, r2 loaded back, checked; the engine for further checks."""
    handoff = extensible_handoff(*case, kv_transfer_config=offload_transfer_config(setup), **build)
    engine = stored_and_clobbered(HandOffEngine(handoff))
    engine.add("r2", prompt(case[2]))
    engine.run_until_idle()
    assert_loaded_exactly(engine)
    return engine


@pytest.mark.parametrize("case", handoff_cases(), ids=case_id)
def test_blocks_load_back_byte_exactly_through_committed_views(extensible_handoff, case):
    engine = loaded_back(extensible_handoff, case, "core")
    kv_cache = engine.handoff.extensible_kv_cache
    sizes = committed_segment_bytes(engine.handoff)
    assert not any(kv_cache.buffer.segments_backed_by_one_chunk(sizes))


@pytest.mark.parametrize("layout", COMPACT_LAYOUTS)
@pytest.mark.parametrize("case", LAYOUT_CASES, ids=case_id)
def test_every_layout_the_extensible_cache_allows_loads_back_byte_exactly(
    extensible_handoff, case, layout
):
    engine = loaded_back(extensible_handoff, case, "core", layout=layout)
    assert engine.handoff.layout == layout


@pytest.mark.parametrize("setup", [s for s in CONNECTORS if s != "core"])
@pytest.mark.parametrize("case", LAYOUT_CASES, ids=case_id)
def test_the_traced_connector_and_the_multi_load_back_byte_exactly(extensible_handoff, case, setup):
    loaded_back(extensible_handoff, case, setup)


@pytest.mark.parametrize("case", LAYOUT_CASES, ids=case_id)
def test_kv_sharing_aliases_of_committed_views_are_copied_once(extensible_handoff, case):
    engine = loaded_back(extensible_handoff, case, "core", num_shared_layers=2)
    assert len(engine.handoff.kv_caches) == len(engine.handoff.shared_layers) + sum(
        len(layers) for layers in engine.group_layers
    )
