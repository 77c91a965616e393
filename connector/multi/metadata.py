"""What the MultiConnector sends to its workers, and what they send back, per child."""

from dataclasses import dataclass, field

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorMetadata,
    KVConnectorWorkerMetadata,
)

from kvscope.connector.multi.groups import GroupBlock, GroupBlockIds

MULTI_METADATA_VERSION = 3
"""3: block ids per KV cache group (vLLM's hybrid KV cache manager)."""


@dataclass(frozen=True)
class LoadRoute:
    """Which child loads a request's external blocks, into which device blocks of each group."""

    child: int
    device_block_ids: GroupBlockIds
    # Blocks of the original hit the loading child does not have (a shorter fallback hit, one
    # KV cache group only): reported failed when its load finishes, so the policy recomputes
    # them.
    missing_block_ids: GroupBlockIds = ()


@dataclass(frozen=True)
class LoadEnd:
    """How a routed load ended on the ranks that reported it so far."""

    child: int
    ranks_ok: int = 0
    ranks_failed: int = 0
    failed_block_ids: frozenset[GroupBlock] = frozenset()  # over every rank that failed it

    def plus(self, other: "LoadEnd") -> "LoadEnd":
        if other.child != self.child:
            raise ValueError(f"one load ended on children {self.child} and {other.child}")
        return LoadEnd(
            self.child,
            self.ranks_ok + other.ranks_ok,
            self.ranks_failed + other.ranks_failed,
            self.failed_block_ids | other.failed_block_ids,
        )


@dataclass
class MultiMetadata(KVConnectorMetadata):
    children: tuple[KVConnectorMetadata | None, ...]
    reqs_to_route: dict[str, LoadRoute] = field(default_factory=dict)
    # Requests whose load failed with no child to fall back to: finish them as failed.
    reqs_to_fail: dict[str, frozenset[GroupBlock]] = field(default_factory=dict)
    # Held-back loads that every rank finished well: report them received now.
    reqs_to_release: set[str] = field(default_factory=set)
    extra_async_saves: dict[str, int] = field(default_factory=dict)
    version: int = MULTI_METADATA_VERSION


@dataclass
class MultiWorkerMeta(KVConnectorWorkerMetadata):
    """One step's reports, summed over ranks by vLLM; the scheduler sums them over steps."""

    children: tuple[KVConnectorWorkerMetadata | None, ...]
    # Routed loads the workers hold back from vLLM until the scheduler decides: a failed one
    # may be retried on another child, and at TP x PP > 1 every rank must have reported.
    loads_ended: dict[str, LoadEnd] = field(default_factory=dict)
    # What each child itself reported as received (req id -> ranks), before the Multi held
    # any back: each child's scheduler half must see its own loads end, on every rank.
    children_recving: tuple[dict[str, int], ...] = ()
    version: int = MULTI_METADATA_VERSION

    def aggregate(self, other: KVConnectorWorkerMetadata) -> KVConnectorWorkerMetadata:
        assert isinstance(other, MultiWorkerMeta), type(other)
        if other.version != self.version:
            raise ValueError(f"Multi worker metadata v{other.version}, expected v{self.version}")
        children = tuple(
            mine if theirs is None else theirs if mine is None else mine.aggregate(theirs)
            for mine, theirs in zip(self.children, other.children, strict=True)
        )
        recving = tuple(
            _sum(a, b) for a, b in zip(self.children_recving, other.children_recving, strict=True)
        )
        ended = dict(self.loads_ended)
        for req_id, end in other.loads_ended.items():
            ended[req_id] = ended[req_id].plus(end) if req_id in ended else end
        return MultiWorkerMeta(children, ended, recving)


def _sum(mine: dict[str, int], theirs: dict[str, int]) -> dict[str, int]:
    merged = dict(mine)
    for key, count in theirs.items():
        merged[key] = merged.get(key, 0) + count
    return merged
