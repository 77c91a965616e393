"""The offload connector's Prometheus metrics on vLLM's /metrics, fed from OffloadStats data.

Names are `vllm:kvscope_offload_*`, labelled with vLLM's own labels (model_name, engine): vLLM
unregisters every `vllm:` collector when it builds its Prometheus logger again, so a second
engine in one process registers them anew instead of failing on duplicates.
"""

from typing import Any

from prometheus_client import Counter, Gauge, Histogram
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorPromMetrics

from kvscope.connector.cpu_offload.stats import FAILURE_CAUSES, FAILURE_OUTCOMES, checked

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
SECONDS_BUCKETS = (0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                   2.5, 5.0, 10.0)  # fmt: skip
BYTES_BUCKETS = tuple(2.0**power for power in range(12, 33, 2))  # 4 KiB .. 4 GiB


class OffloadPromMetrics(KVConnectorPromMetrics):
    """One labelled child per engine and per path, cause and outcome, made up front."""

    def __init__(self, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        self.counters = {key: self._per_engine(self._counter_cls, key, doc)
                         for key, doc in COUNTERS.items()}  # fmt: skip
        self.gauges = {key: self._per_engine(self._gauge_cls, key, doc,
                                             multiprocess_mode="mostrecent")
                       for key, doc in GAUGES.items()}  # fmt: skip
        self.path_bytes = self._per_path(self._counter_cls, "bytes", "Bytes copied, per path.")
        self.path_seconds = self._per_path(
            self._counter_cls, "busy_seconds", "Seconds spent copying, per path, over ranks."
        )
        self.transfer_seconds = self._per_path(
            self._histogram_cls, "transfer_seconds", "Duration of one copy, per path.",
            buckets=SECONDS_BUCKETS,
        )  # fmt: skip
        self.transfer_bytes = self._per_path(
            self._histogram_cls, "transfer_size_bytes", "Bytes of one copy, per path.",
            buckets=BYTES_BUCKETS,
        )  # fmt: skip
        self.kv_wait = self._per_engine(
            self._histogram_cls, "kv_wait_seconds",
            "From a request's lease to the end of its load: its wait for KV from the host pool.",
            buckets=SECONDS_BUCKETS,
        )  # fmt: skip
        failures = self._counter_cls(
            name=PREFIX + "failures", documentation="Failures by cause and what they became.",
            labelnames=[*labelnames, "cause", "outcome"],
        )  # fmt: skip
        self.failures = {(engine, cause, outcome): failures.labels(*values, cause, outcome)
                         for engine, values in per_engine_labelvalues.items()
                         for cause in FAILURE_CAUSES for outcome in FAILURE_OUTCOMES}  # fmt: skip

    def _per_engine(self, cls, key: str, doc: str, **kwargs: Any) -> dict[int, Any]:
        metric = cls(name=PREFIX + key, documentation=doc, labelnames=self._labelnames, **kwargs)
        return {engine: metric.labels(*values) for engine, values in
                self.per_engine_labelvalues.items()}  # fmt: skip

    def _per_path(self, cls, key: str, doc: str, **kwargs: Any) -> dict[tuple[int, str], Any]:
        metric = cls(name=PREFIX + key, documentation=doc,
                     labelnames=[*self._labelnames, "path"], **kwargs)  # fmt: skip
        engines = self.per_engine_labelvalues.items()
        return {(engine, path): metric.labels(*values, path)
                for engine, values in engines for path in PATHS}  # fmt: skip

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        data = checked(transfer_stats_data)
        counters = data["counters"]
        for key, metric in self.counters.items():
            if value := counters.get(key):
                metric[engine_idx].inc(value)
        for key, value in data["gauges"].items():
            self.gauges[key][engine_idx].set(value)
        histograms = data["histograms"]
        for path in PATHS:
            self.path_bytes[engine_idx, path].inc(counters.get(f"{path}_bytes", 0))
            self.path_seconds[engine_idx, path].inc(counters.get(f"{path}_s", 0))
            for sample in histograms.get(f"{path}_seconds", ()):
                self.transfer_seconds[engine_idx, path].observe(sample)
            for sample in histograms.get(f"{path}_size_bytes", ()):
                self.transfer_bytes[engine_idx, path].observe(sample)
        for sample in histograms.get("kv_wait_seconds", ()):
            self.kv_wait[engine_idx].observe(sample)
        for cause, outcomes in data["failures"].items():
            for outcome, count in outcomes.items():
                self.failures[engine_idx, cause, outcome].inc(count)


def build_prom_metrics(vllm_config, metric_types, labelnames, per_engine_labelvalues):
    """Given to vLLM by CpuOffloadCore.build_prom_metrics (and so by the facade and the Multi)."""
    types = {Counter: Counter, Gauge: Gauge, Histogram: Histogram, **metric_types}
    return OffloadPromMetrics(vllm_config, types, labelnames, per_engine_labelvalues)
