"""The P2P connector's Prometheus metrics on vLLM's /metrics, fed from P2PStats data:
`vllm:kvscope_p2p_*`, labelled with vLLM's own labels (model_name, engine)."""

from typing import Any

from kvscope.connector.common.stats_prom import (
    BYTES_BUCKETS,
    SECONDS_BUCKETS,
    SchemaPromMetrics,
)
from kvscope.connector.p2p.stats import SCHEMA

PREFIX = "vllm:kvscope_p2p_"

COUNTERS = {
    "pulls": "Pulls of a prompt's KV from a prefill peer started (decode side, per request).",
    "pull_tokens": "Prompt tokens whose KV was pulled from a prefill peer.",
    "failed_pulls": "Pulls that failed on any rank (counted once per request).",
    "held": "Requests whose blocks were kept for a decode peer to read (prefill side).",
    "leases_expired": "Held blocks freed at their lease deadline, unread or unconfirmed.",
    "tier_bypasses": "Times a prefill peer was bypassed after its pulls kept failing.",
    "tier_bypassed_lookups": "Lookups computed here at once because their peer was bypassed.",
    "reads": "NIXL reads that completed, over ranks (each rank reads its own shard).",
    "read_bytes": "Bytes read over NIXL, over ranks.",
    "failed_reads": "NIXL reads (or their handshakes) that failed, over ranks.",
    "handshakes": "Side-channel handshakes with prefill peers, over ranks.",
    "reads_notified": "Reads of held blocks that their decode peer confirmed (prefill side).",
    "late_notifs": "Read confirmations that came after the lease ended (prefill side).",
    "samples_dropped": "Histogram samples beyond the per-interval bound (totals stay exact).",
}
GAUGES = {
    "held_requests": "Requests whose blocks are held for a decode peer now (prefill side).",
    "pulls_in_flight": "Pulls started and not yet finished on every rank (decode side).",
    "peers": "Prefill peers with a breaker (peers pulled from recently).",
    "peers_bypassed": "Prefill peers bypassed now or being probed after failing pulls.",
}


class P2PPromMetrics(SchemaPromMetrics):
    """The schema's counters, gauges and failures, plus read and KV wait histograms."""

    def __init__(self, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        super().__init__(
            vllm_config,
            metric_types,
            labelnames,
            per_engine_labelvalues,
            prefix=PREFIX,
            schema=SCHEMA,
            counters=COUNTERS,
            gauges=GAUGES,
        )
        histogram = self._histogram_cls
        self.read_busy = self.per_engine(
            self._counter_cls, "read_busy_seconds", "Seconds NIXL reads took, over ranks."
        )
        self.read_seconds = self.per_engine(
            histogram,
            "read_duration_seconds",
            "Duration of one NIXL read (one rank's shard).",
            buckets=SECONDS_BUCKETS,
        )
        self.read_size = self.per_engine(
            histogram,
            "read_size_bytes",
            "Bytes of one NIXL read (one rank's shard).",
            buckets=BYTES_BUCKETS,
        )
        self.kv_wait = self.per_engine(
            histogram,
            "kv_wait_seconds",
            "From a pull's start to its end on every rank: a request's wait for its prompt's KV.",
            buckets=SECONDS_BUCKETS,
        )

    def observe_histograms(self, data: dict[str, Any], engine_idx: int) -> None:
        if seconds := data["counters"].get("read_s"):
            self.read_busy[engine_idx].inc(seconds)
        histograms = data["histograms"]
        for name, metric in (
            ("read_seconds", self.read_seconds),
            ("read_size_bytes", self.read_size),
            ("kv_wait_seconds", self.kv_wait),
        ):
            for sample in histograms.get(name, ()):
                metric[engine_idx].observe(sample)
