"""KV cache groups in the Multi's bookkeeping: block ids per group, and the children HMA needs."""

from typing import Any

from kvscope.traces import names
from kvscope.traces.attribute_values import block_ids_attributes

GroupBlockIds = tuple[tuple[int, ...], ...]
"""Block ids per KV cache group, in vLLM's group order (one tuple without HMA)."""

GroupBlock = tuple[int, int]
"""(group, block id): a block id is an address within one group's block table."""


def num_groups(kv_cache_config: Any) -> int:
    """vLLM's KV cache groups; 1 when there is no config (a connector built outside vLLM)."""
    return max(1, len(getattr(kv_cache_config, "kv_cache_groups", None) or ()))


def load_block_ids(blocks: Any, first: int, end: int) -> GroupBlockIds:
    """Each group's device blocks [first, end) of vLLM's KVCacheBlocks, without the null block
    a sliding-window group holds in place of blocks that left its window (nothing loads there)."""
    per_group = getattr(blocks, "blocks", None)
    if per_group is None:
        return tuple(tuple(ids[first:end]) for ids in blocks.get_block_ids())
    return tuple(
        tuple(block.block_id for block in group[first:end] if not block.is_null)
        for group in per_group
    )


def pairs(block_ids: GroupBlockIds) -> set[GroupBlock]:
    return {(group, block_id) for group, ids in enumerate(block_ids) for block_id in ids}


def matching(block_ids: GroupBlockIds, flat_ids: set[int]) -> set[GroupBlock]:
    """The blocks of block_ids among flat_ids (a child's invalid_block_ids name no group)."""
    return {pair for pair in pairs(block_ids) if pair[1] in flat_ids}


def flat(blocks: set[GroupBlock]) -> set[int]:
    return {block_id for _, block_id in blocks}


def missing(hit: GroupBlockIds, loaded: GroupBlockIds) -> GroupBlockIds:
    """Per group, the hit's blocks a (shorter) fallback load does not fill."""
    return tuple(
        tuple(block_id for block_id in ids if block_id not in set(done))
        for ids, done in zip(hit, loaded, strict=True)
    )


def span_attributes(block_ids: GroupBlockIds) -> dict[str, Any]:
    """Device block ids of a load; with several groups each named by its group."""
    ids = [block_id for group in block_ids for block_id in group]
    attributes = block_ids_attributes(names.BLOCK_IDS, ids)
    if len(block_ids) > 1:
        group_ids = [group for group, ids in enumerate(block_ids) for _ in ids]
        attributes[names.KV_CACHE_GROUP_IDS] = group_ids
    return attributes


def refuse_children_without_hma(children: list[tuple[str, str, bool]], count: int) -> None:
    """With several KV cache groups every child must support HMA (as vLLM's MultiConnector
    requires); raises naming those that do not. children: (name, class name, supports HMA)."""
    without = [
        f"{name} ({class_name})" for name, class_name, supported in children if not supported
    ]
    if count <= 1 or not without:
        return
    which = f"child {without[0]} does" if len(without) == 1 else f"children {', '.join(without)} do"
    raise ValueError(
        f"KvscopeMultiConnector: {which} not support HMA (vLLM's hybrid KV cache manager, "
        f"SupportsHMA) and this model has {count} KV cache groups; HMA with multiple KV cache "
        "groups requires all child connectors to support HMA: start vLLM with "
        "--disable-hybrid-kv-cache-manager, or leave out the children that do not support it"
    )
