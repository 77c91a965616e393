"""The offload connector's Prometheus metrics on vLLM's /metrics, fed from OffloadStats data:
`vllm:kvscope_offload_*`, labelled with vLLM's own labels (model_name, engine)."""

from typing import Any

from kvscope.connector.common.stats_prom import (
    BYTES_BUCKETS,
    SECONDS_BUCKETS,
    SchemaPromMetrics,
)
from kvscope.connector.cpu_offload.stats import SCHEMA

PREFIX = "vllm:kvscope_offload_"
PATHS = ("load", "store")  # host -> KV cache, KV cache -> host

COUNTERS = {
    "lookups": "Lookups in the host pool (a repeated question for the same request not counted).",
    "hit_tokens": "Prompt tokens found in the host pool and leased for a load.",
    "miss_tokens": "Prompt tokens looked up in the host pool and not found.",
    "stored_blocks": "Blocks committed to the host pool.",
    "loaded_blocks": "Blocks loaded from the host pool into the KV cache.",
    "failed_loads": "Loads from the host pool that failed (counted once over all ranks).",
    "failed_load_blocks": "Blocks of failed loads.",
    "evicted_blocks": "Host pool blocks evicted to make room (least recently used first).",
    "lease_expiries": "Leases that ran out before their load ended.",
    "samples_dropped": "Histogram samples beyond the per-interval bound (totals stay exact).",
    "tier_bypasses": "Times the host pool was bypassed after loads kept failing or timing out.",
    "tier_bypassed_lookups": "Lookups answered 0 at once because the host pool was bypassed.",
}
GAUGES = {
    "host_blocks": "Host pool capacity, in blocks.",
    "host_blocks_used": "Host pool blocks holding or receiving KV (committed or reserved).",
    "host_blocks_pinned": "Host pool blocks pinned by leases (not evictable).",
    "pending_stores": "Stores to the host pool not yet reported by every rank.",
    "active_leases": "Leases held by requests waiting for or running their load.",
    "tier_bypassed": "1 while the host pool is bypassed (lookups answer 0; one probe at a time).",
}


class OffloadPromMetrics(SchemaPromMetrics):
    """The schema's counters, gauges and failures, plus copies per path and the KV wait."""

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
        counter, histogram = self._counter_cls, self._histogram_cls
        self.path_bytes = self.per_label(counter, "bytes", "Bytes copied, per path.", "path", PATHS)
        self.path_seconds = self.per_label(
            counter, "busy_seconds", "Seconds spent copying, per path, over ranks.", "path", PATHS
        )
        self.transfer_seconds = self.per_label(
            histogram,
            "transfer_seconds",
            "Duration of one copy, per path.",
            "path",
            PATHS,
            buckets=SECONDS_BUCKETS,
        )
        self.transfer_bytes = self.per_label(
            histogram,
            "transfer_size_bytes",
            "Bytes of one copy, per path.",
            "path",
            PATHS,
            buckets=BYTES_BUCKETS,
        )
        self.kv_wait = self.per_engine(
            histogram,
            "kv_wait_seconds",
            "From a request's lease to the end of its load: its wait for KV from the host pool.",
            buckets=SECONDS_BUCKETS,
        )

    def observe_histograms(self, data: dict[str, Any], engine_idx: int) -> None:
        counters, histograms = data["counters"], data["histograms"]
        for path in PATHS:
            self.path_bytes[engine_idx, path].inc(counters.get(f"{path}_bytes", 0))
            self.path_seconds[engine_idx, path].inc(counters.get(f"{path}_s", 0))
            for sample in histograms.get(f"{path}_seconds", ()):
                self.transfer_seconds[engine_idx, path].observe(sample)
            for sample in histograms.get(f"{path}_size_bytes", ()):
                self.transfer_bytes[engine_idx, path].observe(sample)
        for sample in histograms.get("kv_wait_seconds", ()):
            self.kv_wait[engine_idx].observe(sample)
