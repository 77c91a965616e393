"""The offload connector's KVConnectorStats: the names its versioned, bounded stats dict carries
(the dict's shape and rules: connector/common/stats_schema.py)."""

from dataclasses import dataclass

from kvscope.connector.common.stats_schema import (
    MAX_SAMPLES,
    IntervalReporter,
    Samples,
    SchemaStats,
    StatsSchema,
)

__all__ = ["MAX_SAMPLES", "SCHEMA", "IntervalReporter", "OffloadStats", "Samples", "checked"]

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
