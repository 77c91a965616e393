"""KV connector stats for vLLM's logger: hits, bytes moved and copy throughput."""

from dataclasses import dataclass
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats


@dataclass
class OffloadStats(KVConnectorStats):
    """Counters summed over workers and intervals; reduce() adds throughput."""

    def reset(self) -> None:
        self.data = {}

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        for key, value in other.data.items():
            self.data[key] = self.data.get(key, 0) + value
        return self

    def reduce(self) -> dict[str, int | float]:
        reduced: dict[str, Any] = dict(self.data)
        for direction in ("load", "store"):
            seconds = self.data.get(f"{direction}_s", 0)
            if seconds:
                reduced[f"{direction}_gb_per_s"] = self.data[f"{direction}_bytes"] / seconds / 1e9
        return reduced

    def is_empty(self) -> bool:
        return not any(self.data.values())
