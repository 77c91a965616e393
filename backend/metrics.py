"""The backend's Prometheus metrics read from the database when Prometheus scrapes: each span
stream's gaps, the database's size, silent recomputes and token accounting (the ingest's own
counters are backend/ingest/metrics.py's, in the same registry)."""

import os
import time
from collections.abc import Callable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from sqlalchemy import Engine, text
from sqlmodel import Session, select

from kvscope.backend.db import seqs
from kvscope.backend.db.database import is_sqlite
from kvscope.backend.db.models import Process
from kvscope.backend.ingest.metrics import PREFIX
from kvscope.backend.queries import certainty
from kvscope.backend.queries.accounting import LOCAL, accounting
from kvscope.backend.queries.recomputes import silent_recomputes
from kvscope.backend.settings import Settings


class StreamCollector:
    """Gauges read from the database when Prometheus scrapes: per stream and in all."""

    def __init__(self, engine: Engine, settings: Settings) -> None:
        self.engine = engine
        self.settings = settings

    def collect(self):
        received = _per_stream("spans_received", "Distinct spans received from a process.")
        gaps = _per_stream("gaps", "Holes in a process's span sequence, by state.", "state")
        missing = _per_stream("missing_spans", "Spans of a process not received (holes' sizes).")
        lost = _per_stream("exporter_dropped_spans", "Spans a process's exporter says it dropped.")
        with Session(self.engine) as session:
            self._fill(session, received, gaps, missing, lost)
            size = database_bytes(self.engine, session)
        yield from (received, gaps, missing, lost)
        yield GaugeMetricFamily(PREFIX + "database_bytes", "Size of the database.", value=size)

    def _fill(self, session: Session, received, gaps, missing, lost) -> None:
        counts = seqs.received_counts(session.connection())
        holes = certainty.gaps(session, self.settings.gap_grace_s, now_ns=time.time_ns())
        for process in session.exec(select(Process)).all():
            labels = [process.instance_id, process.service_name or ""]
            received.add_metric(labels, counts.get(process.instance_id, (0, -1))[0])
            mine = [h for h in holes if h.origin == process.instance_id]
            for state in ("pending", "missing"):
                gaps.add_metric([*labels, state], sum(h.state == state for h in mine))
            missing.add_metric(labels, sum(h.count for h in mine))
            lost.add_metric(labels, process.telemetry_dropped or 0)


def _per_stream(name: str, doc: str, *extra_labels: str) -> GaugeMetricFamily:
    labels = ["origin", "service_name", *extra_labels]
    return GaugeMetricFamily(PREFIX + "stream_" + name, doc, labels=labels)


def database_bytes(engine: Engine, session: Session) -> float:
    """Pages in use plus SQLite's write-ahead log; PostgreSQL's own figure for the database."""
    if not is_sqlite(engine):
        return float(session.scalar(text("SELECT pg_database_size(current_database())")))
    pages = session.scalar(text("PRAGMA page_count"))
    page_size = session.scalar(text("PRAGMA page_size"))
    wal = f"{engine.url.database}-wal"
    return float(pages * page_size + (os.path.getsize(wal) if os.path.exists(wal) else 0))


class RecomputeCollector:
    """kvscope_backend_silent_recomputes_total and kvscope_backend_silent_recompute_tokens_total
    per engine and cause: requests that ended normally although a load failed and was recomputed.

    Counted from the database when Prometheus scrapes, not as rows are ingested: a request's end
    (its scheduler's span) and its load failure (its worker's event, vLLM's own report) come from
    different processes in separate batches and either order, and the failure reports fold into
    one incident only once all have arrived; the database holds both sides, so a scrape needs no
    window and a restarted backend goes on from what it stored. Retention deleting old requests
    lowers the totals, which Prometheus reads as a counter reset (rate() stays right)."""

    def __init__(self, engine: Engine, incidents_of: Callable) -> None:
        self.engine = engine
        self.incidents_of = incidents_of  # routes.failures.incidents_in (no import circle)

    def collect(self):
        labels = ["engine_id", "cause"]
        requests = CounterMetricFamily(
            PREFIX + "silent_recomputes",
            "Requests that ended normally although a KV load failed and was recomputed.",
            labels=labels,
        )
        tokens = CounterMetricFamily(
            PREFIX + "silent_recompute_tokens",
            "Prefill tokens recomputed for them (the failed loads' tokens to load).",
            labels=labels,
        )
        with Session(self.engine) as session:
            incidents, _, _ = self.incidents_of(session, None, None)
            found = silent_recomputes(session.connection(), incidents, None, None)
        for row in found.rows:
            requests.add_metric([row.engine_id, row.cause], row.requests)
            tokens.add_metric([row.engine_id, row.cause], row.recomputed_tokens)
        yield from (requests, tokens)


class AccountingCollector:
    """Per engine, from every request's token accounting (read from the database at scrape
    time, as RecomputeCollector and for its reasons): kvscope_backend_prompt_tokens_total,
    kvscope_backend_hit_tokens_total by source (local: vLLM's prefix cache; host, peer, ...:
    the external tiers), kvscope_backend_computed_tokens_total and
    kvscope_backend_accounting_violations_total (requests whose tokens do not add up). The hit
    rate is traces.hit_rate.PROMQL over these: token totals, never a mean of ratios."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def collect(self):
        def family(name: str, doc: str, *labels: str) -> CounterMetricFamily:
            return CounterMetricFamily(PREFIX + name, doc, labels=["engine_id", *labels])

        prompt = family("prompt_tokens", "Prompt tokens of the requests accounted.")
        hits = family("hit_tokens", "Prompt tokens hit, by source (local or a tier).", "source")
        computed = family("computed_tokens", "Prompt tokens no cache held (computed).")
        violations = family(
            "accounting_violations", "Requests whose hits + computed tokens != prompt."
        )
        with self.engine.connect() as connection:
            found = accounting(connection, None, None)
        for row in found.engines:
            prompt.add_metric([row.engine_id], row.prompt_tokens)
            hits.add_metric([row.engine_id, LOCAL], row.local_hit_tokens)
            for tier, tokens in row.external_hit_tokens.items():
                hits.add_metric([row.engine_id, tier], tokens)
            computed.add_metric([row.engine_id], row.computed_tokens)
            violations.add_metric([row.engine_id], row.violations)
        yield from (prompt, hits, computed, violations)
