"""Per-group planning of hits and stores: which block of which group goes to or from the pool."""

from dataclasses import dataclass

from kvscope.connector.cpu_offload.groups import KVGroups
from kvscope.connector.cpu_offload.host_pool import BlockState, HostBlockPool, KVNamespace


@dataclass(frozen=True)
class GroupBlock:
    """One block of one KV cache group of a request: its index in the request and pool key."""

    group_id: int
    index: int
    key: bytes


def request_blocks(
    groups: KVGroups, namespace: KVNamespace, block_hashes: list[bytes], start: int, end: int
) -> dict[int, list[GroupBlock]]:
    """Blocks [start, end) of every kept group, by group id."""
    return {
        group.group_id: [
            GroupBlock(group.group_id, start + offset, key)
            for offset, key in enumerate(
                groups.block_keys(namespace, block_hashes[start:end], group.group_id)
            )
        ]
        for group in groups.groups
    }


def interleave(blocks_by_group: dict[int, list[GroupBlock]]) -> list[GroupBlock]:
    """Block by block, each block's groups together: the pool reserves in order and stops when
    full, and a prefix with all its groups can be hit while one with half of them cannot."""
    merged = [block for blocks in blocks_by_group.values() for block in blocks]
    return sorted(merged, key=lambda block: (block.index, block.group_id))


def plan_hit(
    pool: HostBlockPool, groups: KVGroups, blocks_by_group: dict[int, list[GroupBlock]], start: int
) -> list[GroupBlock]:
    """The blocks to load for the longest hit every group can serve, [] for none.

    A full-attention group needs every block from start to the hit's end; a sliding-window
    group only the window before the end (vLLM keeps the ones before start locally).
    """
    present = {
        group_id: [pool.state_of(block.key) is BlockState.COMMITTED for block in blocks]
        for group_id, blocks in blocks_by_group.items()
    }
    end = start + min((len(blocks) for blocks in blocks_by_group.values()), default=0)
    for group in groups.groups:
        if group.window_blocks is None:
            run = present[group.group_id]
            end = min(end, start + (run.index(False) if False in run else len(run)))
    for hit_end in range(end, start, -1):
        needed = {g.group_id: g.needed(start, hit_end) for g in groups.groups}
        if all(all(present[g][i - start] for i in needed[g]) for g in needed):
            return interleave(
                {
                    g: [blocks_by_group[g][i - start] for i in indices]
                    for g, indices in needed.items()
                }
            )
    return []


def holds_last_loadable_block(
    pool: HostBlockPool,
    groups: KVGroups,
    namespace: KVNamespace,
    block_hashes: list[bytes],
    num_prompt_tokens: int,
    block_size: int,
) -> bool:
    """Whether the pool holds, in every kept group, the last prompt block a hit could load (a
    lookup never loads the last prompt token's block): a cheap sign that a lookup will lease a
    hit and load it asynchronously. Block keys chain, so that block stands for its prefix."""
    last = min((num_prompt_tokens - 1) // block_size, len(block_hashes)) - 1
    if last < 0:
        return False
    return all(
        pool.state_of(key) is BlockState.COMMITTED
        for group in groups.groups
        for key in groups.block_keys(namespace, block_hashes[last : last + 1], group.group_id)
    )
