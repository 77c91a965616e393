"""What the offload scheduler half tracks per request and per planned store."""

from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING

from kvscope.connector.cpu_offload.hits import GroupBlock
from kvscope.connector.cpu_offload.leases import Lease
from kvscope.connector.cpu_offload.metadata import BlockTransfer

if TYPE_CHECKING:
    from vllm.v1.core.block_pool import BlockPool
    from vllm.v1.core.kv_cache_utils import KVCacheBlock
    from vllm.v1.request import Request


class LoadPhase(Enum):
    """Where a request stands with the host pool's KV."""

    LOOKUP = "lookup"  # may be offered a hit (new, loaded, or back from preemption)
    LOADING = "loading"  # the workers are copying its hit into its blocks
    RECOMPUTE = "recompute"  # its load failed: vLLM recomputes, offering the hit again would loop


@dataclass(frozen=True)
class PlannedStore:
    """A store the workers run: its host blocks (reserved until every rank reported)."""

    req_id: str
    host_block_ids: list[int]
    keys: list[bytes]
    group_ids: list[int]
    # The device blocks the copy reads, held (vLLM block pool references) until it ends: a
    # preemption or a moving sliding window would otherwise hand them to another request.
    held_blocks: list["KVCacheBlock"]
    block_pool: "BlockPool | None" = None  # vLLM's, which held_blocks go back to
    dropped: bool = False  # the cache was reset while it copied: its blocks are not committed


@dataclass
class RequestState:
    """What the scheduler half tracks for one live request."""

    request: "Request"
    phase: LoadPhase = LoadPhase.LOOKUP
    lease: Lease | None = None  # a hit waiting for its load, or loading
    hit: tuple[GroupBlock, ...] = ()  # the lease's blocks, pairwise with its host blocks
    hit_end: int = 0  # the block index the hit ends before
    asked_at: int = -1  # num_computed_tokens of the lookup that took the lease
    # A lease that ran out while its load copied from its blocks: pinned until the load ends.
    expired_lease: Lease | None = None
    load_start_block: int = 0
    load_started_at: float = 0.0  # time.monotonic() when its load was planned
    next_block_to_store: int = 0
    stores_in_flight: set[int] = field(default_factory=set)
    ended: bool = False  # vLLM called request_finished

    @property
    def loading(self) -> bool:
        return self.phase is LoadPhase.LOADING

    def load_transfer(
        self,
        ids_by_group: tuple[list[int], ...],
        num_external_tokens: int,
        block_size: int,
        multi_group: bool,
    ) -> BlockTransfer:
        """The load of the leased hit into the device blocks vLLM allocated for it (its
        block ids per group); RuntimeError when vLLM's external tokens are not the hit's."""
        lease, req_id = self.lease, str(self.request.request_id)
        destination = tuple(
            ids_by_group[b.group_id][b.index]
            for b in self.hit
            if b.index < len(ids_by_group[b.group_id])
        )
        leased = self.hit_end - self.load_start_block
        if num_external_tokens // block_size != leased or len(destination) != len(self.hit):
            raise RuntimeError(
                f"request {req_id}: {num_external_tokens} external tokens do not "
                f"match the {leased} leased blocks"
            )
        group_ids = tuple(b.group_id for b in self.hit) if multi_group else ()
        return BlockTransfer(req_id, destination, lease.host_block_ids, lease.lease_id, group_ids)
