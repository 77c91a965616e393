"""The P2P connector's KVConnectorStats: the names its versioned, bounded stats dict carries
(the dict's shape and rules: connector/common/stats_schema.py).

The scheduler half reports pulls and their outcomes once per request (however many ranks read),
leases it keeps for readers, and its peers' breakers; each worker rank reports the NIXL reads of
its own shard (vLLM sums them over ranks).
"""

from dataclasses import dataclass

from kvscope.connector.common.stats_schema import Counters, SchemaStats, StatsSchema

SCHEDULER_COUNTERS = (
    "pulls",
    "pull_tokens",
    "failed_pulls",
    "held",
    "leases_expired",
    "tier_bypasses",
    "tier_bypassed_lookups",
)
WORKER_COUNTERS = (
    "reads",
    "read_bytes",
    "read_s",
    "failed_reads",
    "handshakes",
    "reads_notified",
    "late_notifs",
)
COUNTERS = (*SCHEDULER_COUNTERS, *WORKER_COUNTERS, "samples_dropped")
GAUGES = ("held_requests", "pulls_in_flight", "peers", "peers_bypassed")
HISTOGRAMS = ("read_seconds", "read_size_bytes", "kv_wait_seconds")
FAILURE_CAUSES = (
    "bad_params",
    "layout_mismatch",
    "not_covered",
    "peer_unreachable",
    "lease_expired",
    "read_failed",
)
"""Refused lookups (the first three: nothing was read) and failed pulls (the puller's kinds)."""
FAILURE_OUTCOMES = ("recomputed", "failed", "left_to_parent")
SCHEMA = StatsSchema(
    "P2PConnector",
    COUNTERS,
    GAUGES,
    HISTOGRAMS,
    FAILURE_CAUSES,
    FAILURE_OUTCOMES,
    throughputs=("read",),
)


@dataclass
class P2PStats(SchemaStats):
    """The P2P connector's stats: counters and failures add up over ranks and steps, gauges
    are the scheduler half's newest, histogram samples concatenate."""

    SCHEMA = SCHEMA


@SCHEMA.counted_by
@dataclass
class SchedulerCounters(Counters):
    """The scheduler half's pulls (once per request), leases and peer bypasses since start."""

    pulls: int = 0
    pull_tokens: int = 0
    failed_pulls: int = 0  # counted once, when every rank reported the pull
    held: int = 0  # leases taken for a reader
    leases_expired: int = 0
    tier_bypasses: int = 0  # the peers' breakers' own counts, copied each step
    tier_bypassed_lookups: int = 0


@SCHEMA.counted_by
@dataclass
class ReadCounters(Counters):
    """One rank's NIXL reads of its shard (the puller's) since start."""

    reads: int = 0
    read_bytes: int = 0
    read_s: float = 0.0
    failed_reads: int = 0
    handshakes: int = 0


@SCHEMA.counted_by
@dataclass
class LoanCounters(Counters):
    """One rank's loans to readers (the lender's) since start; its expired leases are the
    scheduler half's to report, once per request."""

    reads_notified: int = 0
    leases_expired: int = 0
    late_notifs: int = 0


def failure_kind(cause: str) -> str:
    """The puller's cause 'kind: words' as a FAILURE_CAUSES name ('read_failed' if unknown)."""
    kind = cause.split(":", 1)[0]
    return kind if kind in FAILURE_CAUSES else "read_failed"
