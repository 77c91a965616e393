"""What the offload scheduler half tells its workers each step, and what workers report back."""

from dataclasses import dataclass, field

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorMetadata,
    KVConnectorWorkerMetadata,
)

OFFLOAD_METADATA_VERSION = 4


@dataclass(frozen=True)
class BlockTransfer:
    """Whole blocks of one request between device block ids and host block ids, pairwise.

    With several KV cache groups (vLLM's hybrid KV cache manager) group_ids says, pairwise,
    which group each device block id belongs to (ids are addresses within a group); empty for
    a model with one group."""

    req_id: str
    device_block_ids: tuple[int, ...]
    host_block_ids: tuple[int, ...]
    transfer_id: int  # a lease id for loads, a reservation id for stores
    group_ids: tuple[int, ...] = ()


@dataclass
class OffloadMetadata(KVConnectorMetadata):
    """One step's plan: loads start before the requests resume, stores after the forward."""

    reqs_to_load: list[BlockTransfer] = field(default_factory=list)
    reqs_to_store: list[BlockTransfer] = field(default_factory=list)
    # Requests whose stores the worker must finish before vLLM may reuse their blocks.
    reqs_to_flush: set[str] = field(default_factory=set)
    # Requests vLLM preempted this step whose stores hold no reference on the blocks they read
    # (see stores.unheld_of): their blocks may be reused once those stores ended.
    reqs_preempted: set[str] = field(default_factory=set)
    num_host_blocks: int = 0
    version: int = OFFLOAD_METADATA_VERSION


@dataclass
class OffloadWorkerMeta(KVConnectorWorkerMetadata):
    """One step's copy outcomes, as counts of ranks: vLLM sums them over the ranks of a step,
    the scheduler half over steps (connector/common/rank_tally.py)."""

    stores_done: dict[int, int] = field(default_factory=dict)  # reservation id -> ranks
    stores_failed: dict[int, int] = field(default_factory=dict)
    loads_done: dict[str, int] = field(default_factory=dict)  # request id -> ranks
    loads_failed: dict[str, int] = field(default_factory=dict)
    version: int = OFFLOAD_METADATA_VERSION

    def aggregate(self, other: KVConnectorWorkerMetadata) -> KVConnectorWorkerMetadata:
        assert isinstance(other, OffloadWorkerMeta), type(other)
        if other.version != self.version:
            raise ValueError(f"offload worker metadata v{other.version}, expected v{self.version}")
        return OffloadWorkerMeta(
            _sum(self.stores_done, other.stores_done),
            _sum(self.stores_failed, other.stores_failed),
            _sum(self.loads_done, other.loads_done),
            _sum(self.loads_failed, other.loads_failed),
        )

    def is_empty(self) -> bool:
        return not (self.stores_done or self.stores_failed or self.loads_done or self.loads_failed)


def _sum(mine: dict, theirs: dict) -> dict:
    merged = dict(mine)
    for key, count in theirs.items():
        merged[key] = merged.get(key, 0) + count
    return merged
