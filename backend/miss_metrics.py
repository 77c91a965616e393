"""Prometheus counters of why prompt tokens missed the tiers and of what the host tiers did with
their blocks, kept as the backend reads the stored spans when Prometheus scrapes."""

import threading
import time

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
from sqlalchemy import Engine

from kvscope.backend.ingest.metrics import PREFIX
from kvscope.backend.queries.accounting import request_accounts
from kvscope.backend.queries.misses.explain import explain
from kvscope.backend.queries.misses.history import read_accesses
from kvscope.backend.queries.misses.report import HISTORY_S, recomputed_loads
from kvscope.backend.queries.misses.walk import EngineWalk

SETTLE_S = 30.0
"""A request is counted this long after it ended: its workers' failure reports come in other
batches, from other processes."""

IDLE_BUCKETS = (1.0, 10.0, 60.0, 300.0, 900.0, 3600.0, float("inf"))
"""Seconds: idle before eviction, and between uses."""


class _Histogram:
    def __init__(self) -> None:
        self.counts = [0] * len(IDLE_BUCKETS)
        self.total = 0.0

    def add(self, values: list[float]) -> None:
        for value in values:
            self.total += value
            for index, bound in enumerate(IDLE_BUCKETS):
                if value <= bound:
                    self.counts[index] += 1
        values.clear()

    def buckets(self) -> list[tuple[str, int]]:
        return [
            ("+Inf" if b == float("inf") else f"{b:g}", c)
            for b, c in zip(IDLE_BUCKETS, self.counts, strict=True)
        ]


class MissCollector:
    """kvscope_backend_missed_tokens_total{engine_id, reason}: prompt tokens not served from a
    tier, by reason (backend/queries/misses/vocabulary.py); per engine's host tier,
    kvscope_backend_tier_stored_blocks_total, _tier_hit_blocks_total,
    _tier_evicted_blocks_total{read} (read: 'true', 'false' or 'unknown', stored before the
    history) and the histograms _tier_idle_before_evict_seconds and _tier_reuse_gap_seconds.

    The counts go on from the backend's start: the first scrape walks the hour before it
    (HISTORY_S), each later one only what arrived since (SETTLE_S behind now). The walk is
    kept between scrapes and forgets what is older than an hour, so a scrape reads new rows
    only. A restart starts the counters again (Prometheus reads a counter reset)."""

    def __init__(self, engine: Engine, settle_s: float = SETTLE_S) -> None:
        self.engine = engine
        self.settle_s = settle_s
        self._lock = threading.Lock()
        self._until_ns: int | None = None
        self._walks: dict[str, EngineWalk] = {}
        self._tokens: dict[tuple[str, str], int] = {}
        self._idle: dict[str, _Histogram] = {}
        self._gaps: dict[str, _Histogram] = {}

    def collect(self):
        with self._lock:
            self._advance(time.time_ns() - int(self.settle_s * 1e9))
            yield from self._families()

    def _advance(self, until_ns: int) -> None:
        since_ns = until_ns - int(HISTORY_S * 1e9) if self._until_ns is None else self._until_ns
        if until_ns <= since_ns:
            return
        with self.engine.connect() as connection:
            for access in read_accesses(connection, since_ns, until_ns):
                walk = self._walks.setdefault(access.engine_id, EngineWalk(since_ns))
                walk.feed(access)
            failed = recomputed_loads(connection, since_ns - int(HISTORY_S * 1e9), until_ns)
            for account in request_accounts(connection, since_ns, until_ns):
                found = explain(
                    account, self._walks.get(account.engine_id), account.request_id in failed
                )
                for reason in found.reasons:
                    key = (found.engine_id, reason.reason)
                    self._tokens[key] = self._tokens.get(key, 0) + reason.tokens
        for engine_id, walk in self._walks.items():
            self._idle.setdefault(engine_id, _Histogram()).add(walk.stats.idle_before_evict_s)
            self._gaps.setdefault(engine_id, _Histogram()).add(walk.stats.reuse_gap_s)
            walk.stats.reuse_distance_blocks.clear()
            walk.forget(until_ns - int(HISTORY_S * 1e9))
        self._until_ns = until_ns

    def _families(self):
        missed = CounterMetricFamily(
            PREFIX + "missed_tokens",
            "Prompt tokens not served from a tier, by reason (they add up to prompt - served).",
            labels=["engine_id", "reason"],
        )
        for (engine_id, reason), tokens in sorted(self._tokens.items()):
            missed.add_metric([engine_id, reason], tokens)
        yield missed
        stored = _tier_family("tier_stored_blocks", "Blocks stored to the host tier.")
        hit = _tier_family("tier_hit_blocks", "Blocks of the host tier a lookup hit.")
        evicted = _tier_family(
            "tier_evicted_blocks",
            "Blocks evicted from the host tier, by whether a lookup read them since their store.",
            "read",
        )
        idle = _tier_histogram(
            "tier_idle_before_evict_seconds", "Last use (store or hit) to eviction."
        )
        gaps = _tier_histogram("tier_reuse_gap_seconds", "Store or previous hit to the next hit.")
        for engine_id, walk in sorted(self._walks.items()):
            stats, labels = walk.stats, [engine_id, "host"]
            stored.add_metric(labels, stats.stored_blocks)
            hit.add_metric(labels, stats.hit_blocks)
            unread, unknown = stats.evicted_unread, stats.evicted_unknown
            evicted.add_metric([*labels, "true"], stats.evicted_blocks - unread - unknown)
            evicted.add_metric([*labels, "false"], unread)
            evicted.add_metric([*labels, "unknown"], unknown)
            for family, histograms in ((idle, self._idle), (gaps, self._gaps)):
                histogram = histograms[engine_id]
                family.add_metric(labels, histogram.buckets(), histogram.total)
        yield from (stored, hit, evicted, idle, gaps)


def _tier_family(name: str, doc: str, *labels: str) -> CounterMetricFamily:
    return CounterMetricFamily(PREFIX + name, doc, labels=["engine_id", "tier", *labels])


def _tier_histogram(name: str, doc: str) -> HistogramMetricFamily:
    return HistogramMetricFamily(PREFIX + name, doc, labels=["engine_id", "tier"])
