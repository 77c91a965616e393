"""What a load through the offload connector must leave in a GPU hand-off's views.

A first request's prompt is computed and stored, vLLM's prefix cache emptied and every KV byte
clobbered; a second request with the same prompt then loads: each loaded block holds the first
request's bytes exactly, and every other block (the second request's partial last block, which
the forward leaves alone, included) still holds SENTINEL.
"""

from __future__ import annotations

from typing import Final

from tests.gpu_handoff.stepper import SENTINEL, HandOffEngine

PROMPT_BLOCKS: Final = 4
"""Full blocks of the prompt; a few more tokens follow."""


def stored_and_clobbered(engine: HandOffEngine) -> HandOffEngine:
    """r1's prompt computed and stored, vLLM's prefix cache emptied, every KV byte clobbered."""
    engine.add("r1", prompt(engine.block_size))
    engine.run_until_idle()
    engine.clobber()
    return engine


def prompt(block_size: int) -> list[int]:
    return [100 + i % 1000 for i in range(PROMPT_BLOCKS * block_size + 3)]


def assert_loaded_exactly(engine: HandOffEngine, req_id: str = "r2") -> None:
    """r2's hit blocks hold r1's bytes; every other block (r2's partial last block, which the
    forward leaves alone, included) still holds SENTINEL."""
    handoff = engine.handoff
    seen: set[tuple[str, int]] = set()
    loaded = 0
    for group, ids in enumerate(engine.block_ids(req_id)):
        for index, block_id in enumerate(ids):
            if block_id == 0 or index >= PROMPT_BLOCKS:  # 0: a sliding window skipped it
                continue
            for layer_name in engine.group_layers[group]:
                got = handoff.block_bytes(layer_name, block_id)
                expected = engine.written("r1", group, index, layer_name)
                assert got.equal(expected), (layer_name, group, index, block_id)
                seen.add((layer_name, block_id))
                loaded += 1
    assert loaded, "r2 loaded no block from the host pool"
    for layer_name in handoff.kv_caches:
        target = handoff.shared_layers.get(layer_name, layer_name)
        for block_id in range(handoff.num_blocks):
            if (target, block_id) in seen or _overlaid(engine, target, block_id, seen):
                continue
            untouched = handoff.block_bytes(layer_name, block_id)
            assert bool((untouched == SENTINEL).all()), (layer_name, block_id, "was written")


def _overlaid(engine: HandOffEngine, layer_name: str, block_id: int, seen) -> bool:
    """Whether another group's layer that views the same memory holds this block."""
    address = engine.handoff.kv_caches[layer_name].data_ptr()
    return any(
        engine.handoff.kv_caches[other].data_ptr() == address and b == block_id for other, b in seen
    )
