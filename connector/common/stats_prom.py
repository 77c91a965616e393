"""Prometheus metrics on vLLM's /metrics for a connector's SchemaStats: a counter per counter, a
gauge per gauge and a failures counter by cause and outcome, each labelled with vLLM's labels."""

from typing import Any

from prometheus_client import Counter, Gauge, Histogram
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorPromMetrics

from kvscope.connector.common.stats_schema import StatsSchema

SECONDS_BUCKETS = (
    0.0001,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
BYTES_BUCKETS = tuple(2.0**power for power in range(12, 33, 2))  # 4 KiB .. 4 GiB


def _with_defaults(given: dict) -> dict:
    """vLLM's metric classes (multiprocess-aware) over prometheus_client's defaults."""
    return {Counter: Counter, Gauge: Gauge, Histogram: Histogram, **given}


class SchemaPromMetrics(KVConnectorPromMetrics):
    """One labelled child per engine (and per cause and outcome), made up front.

    `counters` and `gauges` map stats keys to their help text; `prefix` starts every name.
    A connector's build_prom_metrics returns its subclass made with vLLM's four arguments.

    vLLM unregisters every `vllm:` collector when it builds its Prometheus logger again, so a second
    engine in one process registers them anew instead of failing on duplicates. Histograms are each
    connector's own (cpu_offload/prom.py, p2p/prom.py): their buckets and labels differ.
    """

    def __init__(
        self,
        vllm_config,
        metric_types,
        labelnames,
        per_engine_labelvalues,
        *,
        prefix: str,
        schema: StatsSchema,
        counters: dict[str, str],
        gauges: dict[str, str],
    ):
        types = _with_defaults(metric_types)
        super().__init__(vllm_config, types, labelnames, per_engine_labelvalues)
        self.prefix, self.schema = prefix, schema
        self.counters = {
            key: self.per_engine(self._counter_cls, key, doc) for key, doc in counters.items()
        }
        self.gauges = {
            key: self.per_engine(self._gauge_cls, key, doc, multiprocess_mode="mostrecent")
            for key, doc in gauges.items()
        }
        failures = self._counter_cls(
            name=prefix + "failures",
            documentation="Failures by cause and what they became.",
            labelnames=[*labelnames, "cause", "outcome"],
        )
        self.failures = {
            (engine, cause, outcome): failures.labels(*values, cause, outcome)
            for engine, values in per_engine_labelvalues.items()
            for cause in schema.failure_causes
            for outcome in schema.failure_outcomes
        }

    def per_engine(self, cls, key: str, doc: str, **kwargs: Any) -> dict[int, Any]:
        metric = cls(
            name=self.prefix + key, documentation=doc, labelnames=self._labelnames, **kwargs
        )
        return {
            engine: metric.labels(*values) for engine, values in self.per_engine_labelvalues.items()
        }

    def per_label(
        self, cls, key: str, doc: str, label: str, label_values: tuple[str, ...], **kwargs: Any
    ) -> dict[tuple[int, str], Any]:
        metric = cls(
            name=self.prefix + key,
            documentation=doc,
            labelnames=[*self._labelnames, label],
            **kwargs,
        )
        engines = self.per_engine_labelvalues.items()
        return {
            (engine, value): metric.labels(*values, value)
            for engine, values in engines
            for value in label_values
        }

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        data = self.schema.checked(transfer_stats_data)
        counters = data["counters"]
        for key, metric in self.counters.items():
            if value := counters.get(key):
                metric[engine_idx].inc(value)
        for key, value in data["gauges"].items():
            if key in self.gauges:
                self.gauges[key][engine_idx].set(value)
        for cause, outcomes in data["failures"].items():
            for outcome, count in outcomes.items():
                self.failures[engine_idx, cause, outcome].inc(count)
        self.observe_histograms(data, engine_idx)

    def observe_histograms(self, data: dict[str, Any], engine_idx: int) -> None:
        """The connector's own histograms and per-label counters from checked data."""
