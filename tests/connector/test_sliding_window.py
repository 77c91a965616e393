"""The sliding-window blocks a hit must load (offload) or a reader must read (P2P) are the
ones vLLM's SlidingWindowManager keeps, extra_retained_tokens (a drafter's) included."""

from types import SimpleNamespace

import pytest
import torch
from vllm.v1.core.single_type_kv_cache_manager import SlidingWindowManager
from vllm.v1.kv_cache_interface import SlidingWindowSpec

from kvscope.connector.cpu_offload.groups import _group

BLOCK = 32


def spec(window: int, extra: int) -> SlidingWindowSpec:
    return SlidingWindowSpec(
        block_size=BLOCK,
        num_kv_heads=2,
        head_size=32,
        dtype=torch.bfloat16,
        sliding_window=window,
        extra_retained_tokens=extra,
    )


def blocks_vllm_keeps(window: int, extra: int, hit_blocks: int) -> int:
    """Blocks before a hit's end that vLLM does not skip (free as null) after the hit."""
    manager = SimpleNamespace(sliding_window=window, extra_retained_tokens=extra)
    skipped = SlidingWindowManager.get_num_skipped_tokens(manager, hit_blocks * BLOCK)
    return hit_blocks - skipped // BLOCK


@pytest.mark.parametrize("window", [33, 64, 65, 100, 128])
@pytest.mark.parametrize("extra", [0, 1, 3, 31, 40])
def test_the_window_is_what_vllm_keeps_after_a_hit(window, extra):
    group = _group(1, spec(window, extra))
    hit_blocks = 12
    needed = group.needed(0, hit_blocks)
    assert len(needed) == blocks_vllm_keeps(window, extra, hit_blocks)
    assert needed[-1] == hit_blocks - 1


@pytest.mark.parametrize("window", [33, 64, 100])
@pytest.mark.parametrize("extra", [0, 3, 40])
@pytest.mark.parametrize("tokens", [31, 64, 200, 383])
def test_a_p2p_reader_starts_where_vllm_stops_skipping(window, extra, tokens):
    from kvscope.connector.p2p.groups import _group as p2p_group

    group = p2p_group(1, spec(window, extra))
    manager = SimpleNamespace(sliding_window=window, extra_retained_tokens=extra)
    skipped = SlidingWindowManager.get_num_skipped_tokens(manager, tokens)
    assert group.first_needed(tokens, BLOCK) == skipped // BLOCK
