"""The KV cache groups P2P moves: which blocks of a request each group's reader needs.

vLLM's hybrid KV cache manager gives a model one group per kind of attention layer. Block ids
are addresses within one group's block table, and vLLM overlays the groups' layers on shared KV
memory (one layer of each group per tensor; a block id belongs to one group at a time), so a
block of any group is read across every KV memory, and each group pairs its own block ids.
"""

from dataclasses import dataclass
from typing import Any

from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec

SUPPORTED_KINDS = "full attention and sliding window attention"
"""The group kinds P2P moves; any other kind (Mamba/SSM, chunked local, ...) refuses to start."""


@dataclass(frozen=True)
class P2PGroup:
    """One KV cache group; `sliding_window` in tokens, None for full attention.

    `extra_retained_tokens`: trailing tokens vLLM keeps behind the window when a drafter may
    re-prefill them (SlidingWindowSpec's field): their blocks stay real, so a reader fills them.
    """

    group_id: int
    sliding_window: int | None = None
    extra_retained_tokens: int = 0

    def first_needed(self, num_tokens: int, block_size: int) -> int:
        """The first block index a reader of `num_tokens` computed tokens attends to: vLLM
        (SlidingWindowManager.get_num_skipped_tokens) puts the null block before it."""
        if self.sliding_window is None:
            return 0
        skipped = num_tokens - self.sliding_window + 1 - self.extra_retained_tokens
        return max(0, skipped) // block_size

    @property
    def kind(self) -> str:
        return "full_attention" if self.sliding_window is None else "sliding_window"


@dataclass(frozen=True)
class P2PGroups:
    """Every KV cache group of the engine, in vLLM's order; one full-attention group without
    the hybrid KV cache manager."""

    groups: tuple[P2PGroup, ...] = (P2PGroup(0),)

    @property
    def multi(self) -> bool:
        return len(self.groups) > 1

    @property
    def group_ids(self) -> tuple[int, ...]:
        return tuple(group.group_id for group in self.groups)

    @classmethod
    def of(cls, kv_cache_config: Any) -> "P2PGroups":
        """The groups of a KVCacheConfig; ValueError for kinds P2P cannot move."""
        specs = [group.kv_cache_spec for group in kv_cache_config.kv_cache_groups]
        if len(specs) <= 1:
            return cls()  # one group: moved whole, as before the hybrid KV cache manager
        block_sizes = {spec.block_size for spec in specs}
        if len(block_sizes) > 1:
            raise ValueError(
                f"KV cache groups with different block sizes {sorted(block_sizes)}: the P2P "
                "connector needs one block size; set --block-size"
            )
        return cls(tuple(_group(group_id, spec) for group_id, spec in enumerate(specs)))


def _group(group_id: int, spec: Any) -> P2PGroup:
    # Exact kinds: subclasses (RSWA, sinks, MLA, hidden states) keep other KV than these rules.
    if type(spec) is SlidingWindowSpec:
        return P2PGroup(group_id, spec.sliding_window, spec.extra_retained_tokens)
    if type(spec) is FullAttentionSpec:
        return P2PGroup(group_id)
    raise ValueError(
        f"KV cache group {group_id} is {type(spec).__name__}: the P2P connector moves "
        f"{SUPPORTED_KINDS} groups only; run without it or with "
        "--disable-hybrid-kv-cache-manager"
    )


def held_tails(block_ids: tuple[list[int], ...], null_block_id: int) -> tuple[tuple[int, ...], ...]:
    """Prefill side: each group's blocks from its first real one (vLLM put the null block in
    place of the sliding-window blocks the next token no longer attends to)."""
    tails = []
    for group in block_ids:
        first = next((i for i, b in enumerate(group) if b != null_block_id), len(group))
        tails.append(tuple(group[first:]))
    return tuple(tails)


def needed_ranges(
    groups: P2PGroups, num_computed: int, num_tokens: int, block_size: int
) -> list[range]:
    """Block indices each group reads for a hit of tokens [num_computed, num_tokens)."""
    first, end = num_computed // block_size, -(-num_tokens // block_size)
    return [
        range(max(first, group.first_needed(num_tokens, block_size)), end)
        for group in groups.groups
    ]


def pull_pairs(
    ranges: list[range], remote: Any, local_ids: tuple[list[int], ...], local_null: Any
) -> tuple[tuple[tuple[int, ...], ...], tuple[tuple[int, ...], ...]]:
    """(local, remote) block ids per group, never a local null block; ValueError where the
    prefill side does not hold a needed block."""
    local_groups, remote_groups = [], []
    for g, needed in enumerate(ranges):
        remote_ids = remote.remote_ids(g, needed.start, needed.stop) if needed else ()
        pairs = [
            (local_ids[g][i], r)
            for i, r in zip(needed, remote_ids, strict=True)
            if not local_null(g, i)
        ]
        local_groups.append(tuple(local for local, _ in pairs))
        remote_groups.append(tuple(r for _, r in pairs))
    return tuple(local_groups), tuple(remote_groups)
