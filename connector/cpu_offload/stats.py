"""The offload connector's KVConnectorStats: the names its versioned, bounded stats dict carries
(the dict's shape and rules: connector/common/stats_schema.py)."""

import time
from dataclasses import dataclass

from kvscope.connector.common.stats_schema import (
    MAX_SAMPLES,
    Counters,
    IntervalReporter,
    Samples,
    SchemaStats,
    StatsSchema,
)
from kvscope.connector.cpu_offload.copy.engine import Direction
from kvscope.connector.cpu_offload.host_pool import HostBlockPool

__all__ = [
    "MAX_SAMPLES",
    "SCHEMA",
    "IntervalReporter",
    "OffloadStats",
    "PoolGauges",
    "Samples",
    "SchedulerCounters",
    "WorkerCounters",
    "checked",
]

COUNTERS = (
    "lookups",
    "hit_tokens",
    "miss_tokens",
    "stored_blocks",
    "loaded_blocks",
    "failed_loads",
    "failed_load_blocks",
    "evicted_blocks",
    "lease_expiries",
    "load_bytes",
    "store_bytes",
    "load_s",
    "store_s",
    "samples_dropped",
    "tier_bypasses",
    "tier_bypassed_lookups",
)
GAUGES = (
    "host_blocks",
    "host_blocks_used",
    "host_blocks_pinned",
    "pending_stores",
    "active_leases",
    "tier_bypassed",
)
HISTOGRAMS = (
    "load_seconds",
    "store_seconds",
    "load_size_bytes",
    "store_size_bytes",
    "kv_wait_seconds",
)
FAILURE_CAUSES = ("lease_expired", "lease_expired_during_load", "load_failed", "store_failed")
FAILURE_OUTCOMES = ("released", "kept_pinned", "recomputed", "failed", "left_to_parent", "dropped")
SCHEMA = StatsSchema(
    "CpuOffloadConnector",
    COUNTERS,
    GAUGES,
    HISTOGRAMS,
    FAILURE_CAUSES,
    FAILURE_OUTCOMES,
    throughputs=("load", "store"),
)
checked = SCHEMA.checked


@dataclass
class OffloadStats(SchemaStats):
    """The offload connector's stats: counters and failures add up over ranks and steps,
    gauges are the scheduler half's newest, histogram samples concatenate."""

    SCHEMA = SCHEMA


@SCHEMA.counted_by
@dataclass
class SchedulerCounters(Counters):
    """The scheduler half's own counters since start (the pool's and health's are read)."""

    lookups: int = 0
    hit_tokens: int = 0
    stored_blocks: int = 0
    loaded_blocks: int = 0
    failed_loads: int = 0  # counted once, when every rank reported the load
    failed_load_blocks: int = 0
    miss_tokens: int = 0


@SCHEMA.counted_by
@dataclass
class WorkerCounters(Counters):
    """One worker's bytes copied (successful copies only) and seconds spent copying."""

    load_bytes: int = 0
    store_bytes: int = 0
    load_s: float = 0.0
    store_s: float = 0.0

    def add_copy(self, direction: Direction, num_bytes: int, seconds: float) -> None:
        """One copy's bytes moved and time taken."""
        if direction is Direction.LOAD:
            self.load_bytes, self.load_s = self.load_bytes + num_bytes, self.load_s + seconds
        else:
            self.store_bytes, self.store_s = self.store_bytes + num_bytes, self.store_s + seconds


class PoolGauges:
    """The host pool's gauges and eviction count for the stats, read at most once a second:
    reading them walks every host block."""

    def __init__(self, pool: "HostBlockPool") -> None:
        self.pool = pool
        self._read_at = float("-inf")
        self._gauges: dict[str, int] = {}
        self._evicted = 0

    def read(self) -> tuple[dict[str, int], int]:
        """(host_blocks, host_blocks_used and host_blocks_pinned gauges; evicted blocks)."""
        if time.monotonic() - self._read_at >= 1.0:
            self._read_at, pool = time.monotonic(), self.pool.stats()
            self._gauges = {
                "host_blocks": pool.num_blocks,
                "host_blocks_used": pool.reserved + pool.committed,
                "host_blocks_pinned": pool.pinned,
            }
            self._evicted = pool.evicted_blocks
        return dict(self._gauges), self._evicted
