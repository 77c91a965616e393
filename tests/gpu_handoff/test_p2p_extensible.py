"""P2P over vLLM 0.34's extensible KV cache, as extend_kv_cache hands it over, over real NIXL.

P2P registers the KV cache, so vLLM backs each segment with one physical chunk before the
connector is created; it registers views of the committed bytes only and reads every backend x
model kind byte-exactly, leaving every other block untouched."""

import os

import pytest

pytest.importorskip("vllm")
os.environ.setdefault("UCX_NET_DEVICES", "lo")

from kvscope.connector.p2p.transport.nixl_agent import load_nixl_api  # noqa: E402

try:
    load_nixl_api()
except ImportError as exc:
    pytest.skip(f"no NIXL beside this torch: {exc}", allow_module_level=True)

from tests.gpu_handoff.extensible import committed_segment_bytes  # noqa: E402
from tests.gpu_handoff.p2p_pair import (  # noqa: E402
    assert_read_exactly,
    case_id,
    lend_and_pull,
    pair,
    setup_cases,
)


@pytest.mark.parametrize(
    ("case", "setup"), setup_cases(), ids=lambda v: v if isinstance(v, str) else case_id(v)
)
def test_blocks_read_byte_exactly_through_committed_views(extensible_handoff, case, setup):
    prefill, decode = pair(None, case, setup, handoff_of=extensible_handoff)
    try:
        for side in (prefill, decode):
            kv_cache = side.handoff.extensible_kv_cache
            sizes = committed_segment_bytes(side.handoff)
            assert all(kv_cache.buffer.segments_backed_by_one_chunk(sizes))
        moved = lend_and_pull(prefill, decode)
        assert_read_exactly(prefill, decode, moved)
        assert decode.worker.take_failed_loads() == set()
    finally:
        prefill.close()
        decode.close()


def test_kv_sharing_layers_over_committed_views_are_read_once(extensible_handoff):
    case = ("FLASH_ATTN", "full", 64, "auto")
    prefill, decode = pair(None, case, "core", handoff_of=extensible_handoff, num_shared_layers=1)
    try:
        assert decode.worker.transport.layout.num_layers == 2
        moved = lend_and_pull(prefill, decode)
        assert_read_exactly(prefill, decode, moved)
        page_bytes = decode.handoff.block_bytes(next(iter(decode.handoff.kv_caches)), 0).numel()
        assert decode.worker.puller.stats["read_bytes"] == len(moved) * 2 * page_bytes
    finally:
        prefill.close()
        decode.close()


@pytest.mark.parametrize(
    ("case", "layout", "blocks"),
    [
        (("FLASH_ATTN", "full", 64, "auto"), "LBNHC", 64),
        (("FLASHMLA", "mla", 64, "auto"), None, 256),
    ],
    ids=["LBNHC", "mla"],
)
def test_each_region_p2p_registers_lies_in_one_physical_chunk(
    extensible_handoff, case, layout, blocks
):
    """Where warm-up measured the whole capacity and a layer's segment is whole granules, the
    layers' committed segments abut in the reservation: each is still its own allocation, and
    one NIXL registration may not span two (vLLM defragments per segment for that reason)."""
    from tests.gpu_handoff.host_vmm import HOST_DRIVER

    build = {
        "handoff_of": extensible_handoff,
        "committed_blocks": blocks,
        "capacity_blocks": blocks,
    }
    prefill, decode = pair(None, case, "core", layout=layout, **build)
    try:
        kv_cache = decode.handoff.extensible_kv_cache
        assert decode.handoff.layout == "LBNHC" and len(kv_cache.segment_strides) == 2
        first_end = kv_cache.segment_offsets[0] + committed_segment_bytes(decode.handoff)[0]
        assert first_end == kv_cache.segment_offsets[1], "the case must make the segments abut"
        for side in (prefill, decode):
            for address, length in side.worker.transport.layout.registration_regions():
                assert HOST_DRIVER.chunks_under(address, length) == 1, (address, length)
        assert_read_exactly(prefill, decode, lend_and_pull(prefill, decode))
    finally:
        prefill.close()
        decode.close()
