"""Counts every rank's report of a transfer across steps: it ends when the whole world reported."""

from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

Key = TypeVar("Key", bound=Hashable)


@dataclass
class RankCounts:
    """How many ranks reported one transfer done, and how many failed it."""

    done: int = 0
    failed: int = 0


class RankTally(Generic[Key]):
    """Per-transfer counts of rank reports; a transfer ends once `world_size` ranks reported.

    vLLM sums the workers' metadata of one step (`KVConnectorWorkerMetadata.aggregate`) but keeps
    nothing from step to step, and at TP x PP > 1 ranks finish the same copy in different steps. A
    transfer that waited for every rank within one step would never end when one rank is a poll
    late, and a failure on one rank would be lost if another rank finished first.
    """

    def __init__(self, world_size: int) -> None:
        if world_size < 1:
            raise ValueError(f"world_size must be at least 1, got {world_size}")
        self.world_size = world_size
        self._counts: dict[Key, RankCounts] = {}

    def add(self, done: Mapping[Key, int], failed: Mapping[Key, int]) -> list[tuple[Key, bool]]:
        """Adds one step's summed reports; returns (key, ok) for each transfer that ended now,
        ok only when no rank failed it."""
        ended: list[tuple[Key, bool]] = []
        for key in {*done, *failed}:
            counts = self._counts.setdefault(key, RankCounts())
            counts.done += done.get(key, 0)
            counts.failed += failed.get(key, 0)
            if counts.done + counts.failed >= self.world_size:
                del self._counts[key]
                ended.append((key, counts.failed == 0))
        return ended

    def forget(self, key: Key) -> None:
        """Drops a transfer that will never be reported again (its owner went away)."""
        self._counts.pop(key, None)

    def pending(self) -> dict[Key, RankCounts]:
        """Transfers some but not all ranks reported, for leak checks."""
        return dict(self._counts)

    def __len__(self) -> int:
        return len(self._counts)
