"""What the MultiConnector sends to its workers, and what they send back, per child."""

from dataclasses import dataclass, field

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorMetadata,
    KVConnectorWorkerMetadata,
)

MULTI_METADATA_VERSION = 1


@dataclass(frozen=True)
class LoadRoute:
    """Which child loads a request's external blocks, into which device blocks."""

    child: int
    device_block_ids: tuple[int, ...]
    # Blocks of the original hit the loading child does not have (a shorter fallback hit):
    # reported failed when its load finishes, so the policy recomputes them.
    missing_block_ids: tuple[int, ...] = ()


@dataclass
class MultiMetadata(KVConnectorMetadata):
    children: tuple[KVConnectorMetadata | None, ...]
    reqs_to_route: dict[str, LoadRoute] = field(default_factory=dict)
    # Requests whose load failed with no child to fall back to: finish them as failed.
    reqs_to_fail: dict[str, tuple[int, ...]] = field(default_factory=dict)
    extra_async_saves: dict[str, int] = field(default_factory=dict)
    version: int = MULTI_METADATA_VERSION


@dataclass
class MultiWorkerMeta(KVConnectorWorkerMetadata):
    children: tuple[KVConnectorWorkerMetadata | None, ...]
    # req id -> (child whose load failed, its failed device block ids)
    loads_failed: dict[str, tuple[int, tuple[int, ...]]] = field(default_factory=dict)
    # What each child itself reported as received, before the Multi held any back: each
    # child's scheduler half must see its own loads end.
    children_recving: tuple[frozenset[str], ...] = ()

    def aggregate(self, other: KVConnectorWorkerMetadata) -> KVConnectorWorkerMetadata:
        assert isinstance(other, MultiWorkerMeta)
        children = tuple(
            mine if theirs is None else theirs if mine is None else mine.aggregate(theirs)
            for mine, theirs in zip(self.children, other.children, strict=True)
        )
        recving = tuple(
            a | b for a, b in zip(self.children_recving, other.children_recving, strict=True)
        )
        return MultiWorkerMeta(children, {**self.loads_failed, **other.loads_failed}, recving)
