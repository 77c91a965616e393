"""The KV cache groups the offload connector keeps: which blocks a hit needs in each, and keys."""

from dataclasses import dataclass

from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheSpec,
    MLAAttentionSpec,
    SlidingWindowMLASpec,
    SlidingWindowSpec,
)

from kvscope.connector.cpu_offload.host_pool import KVNamespace

SUPPORTED_KINDS = "full attention (incl. MLA) and sliding window attention"
"""The group kinds this connector keeps; any other prefix-cacheable group refuses to start."""


@dataclass(frozen=True)
class KVGroup:
    """One KV cache group: its id in vLLM's block id tuples and what a hit needs of it."""

    group_id: int
    # Sliding window: the blocks before a hit's end that the next token attends to.
    # None: full attention, which needs the whole prefix.
    window_blocks: int | None = None

    def needed(self, start: int, end: int) -> range:
        """Block indices this group must load for a hit of blocks [start, end)."""
        if self.window_blocks is None:
            return range(start, end)
        return range(max(start, end - self.window_blocks), end)

    @property
    def kind(self) -> str:
        return "full_attention" if self.window_blocks is None else "sliding_window"


@dataclass(frozen=True)
class KVGroups:
    """The groups a connector keeps, in vLLM's order; one full-attention group without HMA.

    vLLM's hybrid KV cache manager gives a model one group per kind of attention layer (full
    attention, sliding window); block ids are addresses within one group's block table, and the same
    tokens have different KV in each group, so every host block key names its group.
    """

    groups: tuple[KVGroup, ...] = (KVGroup(0),)
    num_groups: int = 1  # all of vLLM's groups, kept or not: the length of its block id tuples

    @property
    def multi(self) -> bool:
        """Whether hits follow each group's own rule and keys name their group: with several
        groups, and with one sliding-window group (a model of only sliding-window layers),
        whose hit needs only the window and whose skipped blocks are vLLM's null block."""
        return self.num_groups > 1 or any(g.window_blocks is not None for g in self.groups)

    @classmethod
    def of(cls, kv_cache_config: KVCacheConfig) -> "KVGroups":
        """The kept groups of a KVCacheConfig; raises for kinds no host pool can serve."""
        all_groups = kv_cache_config.kv_cache_groups
        block_sizes = {all_groups[g].kv_cache_spec.block_size for g in _cacheable(kv_cache_config)}
        if len(block_sizes) > 1:
            raise ValueError(
                f"KV cache groups with different block sizes {sorted(block_sizes)}: the CPU "
                "offload connector needs one block size; set --block-size"
            )
        groups = tuple(_group(g, all_groups[g].kv_cache_spec) for g in _cacheable(kv_cache_config))
        return cls(groups, len(all_groups))

    def block_keys(
        self, namespace: KVNamespace, block_hashes: list[bytes], group_id: int
    ) -> list[bytes]:
        """Host pool keys of one group's blocks. With one group they are the plain keys (as
        before HMA); with several every key names its group."""
        if not self.multi:
            return namespace.block_keys(block_hashes)
        tag = b"kvscope.group=%d;" % group_id
        return namespace.block_keys([tag + bytes(block_hash) for block_hash in block_hashes])


def _cacheable(kv_cache_config: KVCacheConfig) -> tuple[int, ...]:
    ids = getattr(kv_cache_config, "prefix_cacheable_group_ids", None)
    return tuple(ids) if ids is not None else tuple(range(len(kv_cache_config.kv_cache_groups)))


def _group(group_id: int, spec: KVCacheSpec) -> KVGroup:
    # Exact kinds: subclasses (RSWA, sinks, hidden states) keep other KV than these rules say.
    if type(spec) in (SlidingWindowSpec, SlidingWindowMLASpec):
        # vLLM's own rule (SlidingWindowManager.get_num_skipped_tokens): the window minus the
        # token itself, plus the trailing tokens a drafter may re-prefill, whose blocks vLLM
        # keeps real after a hit, so a load must fill them too.
        retained = spec.sliding_window - 1 + getattr(spec, "extra_retained_tokens", 0)
        return KVGroup(group_id, -(-retained // spec.block_size))
    if type(spec) in (FullAttentionSpec, MLAAttentionSpec):
        return KVGroup(group_id)
    raise ValueError(
        f"KV cache group {group_id} is {type(spec).__name__}: the CPU offload connector keeps "
        f"{SUPPORTED_KINDS} only; run without it or with --disable-hybrid-kv-cache-manager"
    )


def layers_per_block(kv_cache_config: KVCacheConfig) -> int:
    """KV layer pages a host block holds: one per distinct layer memory, as the worker
    registers them (connector/common/kv_layout.py's distinct_kv_memories).

    vLLM overlays its groups from byte 0 (layer i of every group at one address; a block id
    belongs to one group at a time), so a block of any group spans as many layers as the
    largest group has; the KVCacheTensors' layer start addresses say so exactly, also where one
    group holds layers of several specs side by side. Without tensors (a config built by hand):
    the largest group. KV-sharing layers are in neither: vLLM adds them after the connector is
    built, as aliases of layers that are.
    """
    tensors = getattr(kv_cache_config, "kv_cache_tensors", None) or ()
    starts = {
        tensor.offset + index * tensor.layer_stride
        for tensor in tensors
        for index in range(len(tensor.layers))
    }
    if starts:
        return len(starts)
    return max(len(group.layer_names) for group in kv_cache_config.kv_cache_groups)
