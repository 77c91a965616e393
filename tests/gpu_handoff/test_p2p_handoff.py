"""P2P (untraced and traced) reads every CUDA backend's hand-off byte-exactly, over real NIXL.

Kernel-block views, KV-sharing aliases (moved once) and MLA replicas (one read per rank) too."""

import os

import pytest

pytest.importorskip("vllm")
os.environ.setdefault("UCX_NET_DEVICES", "lo")

from kvscope.connector.p2p.transport.nixl_agent import load_nixl_api  # noqa: E402

try:
    load_nixl_api()
except ImportError as exc:
    pytest.skip(f"no NIXL beside this torch: {exc}", allow_module_level=True)

from kvscope.connector.p2p import core as p2p_core  # noqa: E402
from kvscope.harness.engine import free_port  # noqa: E402
from tests.gpu_handoff.p2p_pair import (  # noqa: E402
    NUM_BLOCKS,
    Side,
    assert_read_exactly,
    case_id,
    lend_and_pull,
    pair,
    setup_cases,
)


@pytest.mark.parametrize(
    ("case", "setup"), setup_cases(), ids=lambda v: v if isinstance(v, str) else case_id(v)
)
def test_blocks_read_byte_exactly_through_the_gpu_views(tiny_model, case, setup):
    prefill, decode = pair(tiny_model, case, setup)
    try:
        moved = lend_and_pull(prefill, decode)
        assert_read_exactly(prefill, decode, moved)
        assert decode.worker.take_failed_loads() == set()
    finally:
        prefill.close()
        decode.close()


def test_kernel_block_views_are_read_as_whole_kv_blocks(tiny_model):
    """FlashMLA's kernel takes 64-token blocks: vLLM hands views with 2 rows per 128-token block."""
    prefill, decode = pair(tiny_model, ("FLASHMLA", "mla", 128, "auto"), "core")
    try:
        assert decode.handoff.layout == "LBNHC" and decode.handoff.blocks_per_kv_block == 2
        assert decode.worker.transport.layout.num_blocks == NUM_BLOCKS
        assert_read_exactly(prefill, decode, lend_and_pull(prefill, decode))
    finally:
        prefill.close()
        decode.close()


def test_kv_sharing_layers_are_registered_and_read_once(tiny_model):
    """vLLM aliases a KV-sharing layer into the dict under a second name after the connector
    was built: its bytes are the target's and move with them, once."""
    case = ("FLASH_ATTN", "full", 64, "auto")
    prefill, decode = pair(tiny_model, case, "core", num_shared_layers=1)
    try:
        assert len(decode.handoff.kv_caches) == 3 and decode.handoff.shared_layers
        layout = decode.worker.transport.layout
        assert layout.num_layers == 2, "a KV-sharing alias was registered as a layer of its own"
        assert decode.handoff.layout == "BLNHC" and layout.block_runs  # one run per block
        moved = lend_and_pull(prefill, decode)
        assert_read_exactly(prefill, decode, moved)  # the alias's view shows the read too
        page_bytes = decode.handoff.block_bytes(next(iter(decode.handoff.kv_caches)), 0).numel()
        assert decode.worker.puller.stats["read_bytes"] == len(moved) * 2 * page_bytes
    finally:
        prefill.close()
        decode.close()


def test_mla_replicas_are_read_once_per_decode_rank_from_its_own_prefill_rank(
    tiny_model, monkeypatch
):
    """MLA stores the same KV on every TP rank (KVCacheConfig.kv_tp_replicas): each decode rank
    reads its copy from the prefill rank of its number, once; no rank reads another's."""
    case = ("FLASHMLA", "mla", 64, "auto")
    base_ports = {"prefill": free_port(), "decode": free_port()}
    sides: dict[tuple[str, int], Side] = {}
    try:
        for rank in (0, 1):
            monkeypatch.setattr(p2p_core, "_tp_rank", lambda tp_size, rank=rank: rank)
            for role, seed in (("prefill", 10 + rank), ("decode", None)):
                side = Side(
                    tiny_model, case, "core", role, base_ports[role], tensor_parallel_size=2
                )
                side.fill(seed)
                sides[(role, rank)] = side
        assert sides[("decode", 0)].handoff.kv_cache_config.kv_tp_replicas == 2
        for rank in (0, 1):
            prefill, decode = sides[("prefill", rank)], sides[("decode", rank)]
            moved = lend_and_pull(prefill, decode)
            assert_read_exactly(prefill, decode, moved)  # rank 0's seed differs from rank 1's
            page_bytes = prefill.handoff.block_bytes(next(iter(prefill.handoff.kv_caches)), 0)
            assert decode.worker.puller.stats["reads"] == 1
            assert decode.worker.puller.stats["read_bytes"] == len(moved) * 2 * page_bytes.numel()
        for rank in (0, 1):
            assert sides[("prefill", rank)].worker.lender.stats["reads_notified"] == 1
    finally:
        for side in sides.values():
            side.close()
