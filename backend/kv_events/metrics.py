"""The KV-event comparison as Prometheus gauges, read at scrape time from the ledger."""

from collections.abc import Callable

from prometheus_client.core import GaugeMetricFamily
from sqlalchemy import Engine

from kvscope.backend.kv_events.divergence import divergence

PREFIX = "kvscope_backend_kv_events_"


class KVEventsCollector:
    """Per engine and tier: blocks by events, by spans, the difference; missed batches."""

    def __init__(self, engine: Engine, subscriber: Callable) -> None:
        self.engine = engine
        self.subscriber = subscriber  # the app's current subscriber, or None

    def describe(self):
        return []

    def collect(self):
        subscriber = self.subscriber()
        if subscriber is None:
            return
        with self.engine.connect() as connection:
            found = divergence(connection, subscriber.ledger.snapshot(), subscriber.running)
        labels = ["endpoint", "engine_id", "tier", "kv_group"]
        claimed = GaugeMetricFamily(
            PREFIX + "claimed_blocks", "Blocks a tier holds by its KV events.", labels=labels
        )
        held = GaugeMetricFamily(
            PREFIX + "span_blocks", "Blocks a tier holds by the connectors' spans.", labels=labels
        )
        diverged = GaugeMetricFamily(
            PREFIX + "divergent_blocks",
            "Blocks claimed by one source and not the other (events vs spans, by count).",
            labels=labels,
        )
        missed = GaugeMetricFamily(
            PREFIX + "missed_batches",
            "KV event batches published and never received (sequence gaps).",
            labels=["endpoint", "engine_id"],
        )
        for engine in found.engines:
            engine_id = engine.engine_id or ""
            missed.add_metric([engine.endpoint, engine_id], engine.missed_batches)
            for tier in engine.tiers:
                key = [engine.endpoint, engine_id, tier.tier, str(tier.kv_group)]
                claimed.add_metric(key, tier.claimed)
                # The three are known together (divergence.py: all None without spans).
                if (
                    tier.held_by_spans is not None
                    and tier.only_in_events is not None
                    and tier.only_in_spans is not None
                ):
                    held.add_metric(key, tier.held_by_spans)
                    diverged.add_metric(key, tier.only_in_events + tier.only_in_spans)
        yield from (claimed, held, diverged, missed)
