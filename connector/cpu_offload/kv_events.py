"""vLLM KV events for the host tier: BlockStored when a block is committed to the host pool,
BlockRemoved when it is evicted, with medium "CPU" as vLLM's SimpleCPUOffloadConnector says."""

from dataclasses import dataclass
from typing import TYPE_CHECKING

from vllm.distributed.kv_events import MEDIUM_CPU, BlockRemoved, BlockStored, KVCacheEvent
from vllm.v1.core.kv_cache_utils import ExternalBlockHash, maybe_convert_block_hash

if TYPE_CHECKING:
    from vllm.v1.request import Request

MEDIUM = MEDIUM_CPU
MAX_QUEUED = 65536
"""Events kept between two take_events() calls (vLLM drains every step); the oldest go first."""


@dataclass(frozen=True)
class BlockFacts:
    """What a BlockStored event says about one block, taken when its store was planned."""

    block_hash: ExternalBlockHash
    parent_block_hash: ExternalBlockHash | None
    token_ids: tuple[int, ...]
    lora_name: str | None
    group_idx: int = 0  # vLLM's KV cache group: one hash is one block in each group


class HostTierEvents:
    """Remembers each host block's vLLM hash from its store's planning until its eviction.

    The events carry vLLM's own block hashes (converted as vLLM converts its GPU tier's), never
    the pool's namespaced keys: a KV-aware router sees one block hash in both tiers, told apart
    by the medium. vLLM's scheduler publishes what take_events() returns after each step.
    """

    def __init__(self, enabled: bool, block_size: int) -> None:
        self.enabled = enabled
        self.block_size = block_size
        self._planned: dict[bytes, BlockFacts] = {}  # pool key -> facts, store in flight
        # pool key -> (vLLM hash, group), once committed: what its BlockRemoved will name
        self._stored: dict[bytes, tuple[ExternalBlockHash, int]] = {}
        self._queue: list[KVCacheEvent] = []

    def planned(
        self, request: "Request", positions: dict[bytes, tuple[int, int]], reserved: list[bytes]
    ) -> None:
        """A store of request's blocks (pool key -> block index, KV cache group), of which
        `reserved` get host blocks."""
        if not self.enabled:
            return
        lora = getattr(request, "lora_request", None)
        for key in reserved:
            index, group_idx = positions[key]
            start = index * self.block_size
            parent = request.block_hashes[index - 1] if index > 0 else None
            self._planned[key] = BlockFacts(
                maybe_convert_block_hash(request.block_hashes[index]),
                None if parent is None else maybe_convert_block_hash(parent),
                tuple(request.all_token_ids[start : start + self.block_size]),
                lora.name if lora is not None else None,
                group_idx,
            )

    def committed(self, keys: list[bytes]) -> None:
        for key in keys:
            if (facts := self._planned.pop(key, None)) is None:
                continue
            self._stored[key] = (facts.block_hash, facts.group_idx)
            self._push(
                BlockStored(
                    block_hashes=[facts.block_hash],
                    parent_block_hash=facts.parent_block_hash,
                    token_ids=list(facts.token_ids),
                    block_size=self.block_size,
                    lora_id=None,
                    medium=MEDIUM,
                    lora_name=facts.lora_name,
                    group_idx=facts.group_idx,
                    locality="LOCAL",
                )
            )

    def aborted(self, keys: list[bytes]) -> None:
        """A failed store: its blocks were never announced."""
        for key in keys:
            self._planned.pop(key, None)

    def removed(self, keys: list[bytes]) -> None:
        by_group: dict[int, list[ExternalBlockHash]] = {}
        for key in keys:
            if (stored := self._stored.pop(key, None)) is not None:
                by_group.setdefault(stored[1], []).append(stored[0])
        for group_idx, hashes in sorted(by_group.items()):
            self._push(
                BlockRemoved(
                    block_hashes=hashes, medium=MEDIUM, group_idx=group_idx, locality="LOCAL"
                )
            )

    def take(self) -> list[KVCacheEvent]:
        events, self._queue = self._queue, []
        return events

    def _push(self, event: KVCacheEvent) -> None:
        self._queue.append(event)
        if len(self._queue) > MAX_QUEUED:
            del self._queue[: len(self._queue) - MAX_QUEUED]
