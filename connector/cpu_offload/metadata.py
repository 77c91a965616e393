"""What the offload scheduler half tells its workers each step, and what workers report back."""

from dataclasses import dataclass, field

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorMetadata,
    KVConnectorWorkerMetadata,
)

OFFLOAD_METADATA_VERSION = 1


@dataclass(frozen=True)
class BlockTransfer:
    """Whole blocks of one request between device block ids and host block ids, pairwise."""

    req_id: str
    device_block_ids: tuple[int, ...]
    host_block_ids: tuple[int, ...]
    transfer_id: int  # a lease id for loads, a reservation id for stores


@dataclass
class OffloadMetadata(KVConnectorMetadata):
    """One step's plan: loads start before the requests resume, stores after the forward."""

    reqs_to_load: list[BlockTransfer] = field(default_factory=list)
    reqs_to_store: list[BlockTransfer] = field(default_factory=list)
    # Requests whose stores the worker must finish before vLLM may reuse their blocks.
    reqs_to_flush: set[str] = field(default_factory=set)
    num_host_blocks: int = 0
    version: int = OFFLOAD_METADATA_VERSION


@dataclass
class OffloadWorkerMeta(KVConnectorWorkerMetadata):
    """Store outcomes, counted across workers: a store commits when every worker stored it."""

    stores_done: dict[int, int] = field(default_factory=dict)  # reservation id -> workers
    stores_failed: set[int] = field(default_factory=set)
    loads_failed: set[str] = field(default_factory=set)  # request ids

    def aggregate(self, other: KVConnectorWorkerMetadata) -> KVConnectorWorkerMetadata:
        assert isinstance(other, OffloadWorkerMeta)
        merged = dict(self.stores_done)
        for store_id, count in other.stores_done.items():
            merged[store_id] = merged.get(store_id, 0) + count
        return OffloadWorkerMeta(
            merged, self.stores_failed | other.stores_failed, self.loads_failed | other.loads_failed
        )
