"""The ingest's own Prometheus counters: spans received, stored and dropped, export requests by
outcome, and the time from a request's body to its spans committed."""

from prometheus_client import CollectorRegistry, Counter, Histogram

PREFIX = "kvscope_backend_"
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
REFUSALS = {"PayloadError": "malformed", "StoreUnavailable": "store_unavailable"}


class IngestMetrics:
    """One registry per app: tests build several apps in one process."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.received = Counter(
            PREFIX + "spans_received", "Spans in export requests read.", registry=self.registry
        )
        self.stored = Counter(
            PREFIX + "spans_stored",
            "Spans new to the database (a retried batch's not counted).",
            registry=self.registry,
        )
        self.dropped = Counter(
            PREFIX + "spans_dropped",
            "Spans rejected (invalid) by the backend, by reason.",
            ["reason"],
            registry=self.registry,
        )
        self.requests = Counter(
            PREFIX + "export_requests",
            "Export requests by outcome.",
            ["outcome"],
            registry=self.registry,
        )
        self.latency = Histogram(
            PREFIX + "ingest_seconds",
            "From an export request's body to its spans committed.",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )

    def stored_batch(self, spans: int, new_spans: int, rejected: int, seconds: float) -> None:
        """An export request answered: `spans` accepted, of which `new_spans` not stored
        before (an exporter's retry of a batch already stored adds none)."""
        self.received.inc(spans + rejected)
        self.stored.inc(new_spans)
        if rejected:
            self.dropped.labels("invalid").inc(rejected)
        self.requests.labels("stored" if spans else "rejected").inc()
        self.latency.observe(seconds)

    def refused(self, error: Exception) -> None:
        """An export request nothing of which was stored (the exporter may send it again)."""
        self.requests.labels(REFUSALS.get(type(error).__name__, "error")).inc()
