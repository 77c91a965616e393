"""Prometheus metrics: the backend's registry and the connectors' vLLM metrics, as collected."""

from types import SimpleNamespace

from docs.gen.backend_app import backend_app
from docs.gen.markdown import code, page, table

VLLM_LABELS = ("model_name", "engine")
"""The labels vLLM gives every connector metric."""


def families(registry) -> list[tuple[str, str, str, str]]:
    """(sample name, type, labels, help) per family, as a scrape shows them."""
    declared = {
        name: tuple(getattr(collector, "_labelnames", ()))
        for collector, names in registry._collector_to_names.items()
        for name in names
    }
    rows = []
    for family in registry.collect():
        name = family.name + ("_total" if family.type == "counter" else "")
        labels = set(declared.get(family.name, ())) | set(declared.get(name, ()))
        labels |= set(getattr(family, "_labelnames", ()) or ())
        for sample in family.samples:
            labels |= set(sample.labels) - {"le", "quantile"}
        labels -= set(VLLM_LABELS)
        rows.append((name, family.type, ", ".join(sorted(labels)), family.documentation))
    return sorted(rows)


def connector_families(connector: type) -> list[tuple[str, str, str, str]]:
    """A connector's build_prom_metrics, as vLLM calls it, into a registry of its own."""
    import functools

    import prometheus_client

    registry = prometheus_client.CollectorRegistry()
    kinds = (prometheus_client.Gauge, prometheus_client.Counter, prometheus_client.Histogram)
    types = {kind: functools.partial(kind, registry=registry) for kind in kinds}
    config = SimpleNamespace(kv_transfer_config=SimpleNamespace(kv_connector_extra_config={}))
    connector.build_prom_metrics(config, types, list(VLLM_LABELS), {0: ["model", "0"]})
    return families(registry)


def backend_families() -> list[tuple[str, str, str, str]]:
    """The registry create_app builds, with a KV-event subscriber of one endpoint (never
    started) so that its families are collected too."""
    from kvscope.backend.kv_events.ledger import EventLedger

    with backend_app() as app:
        ledger = EventLedger({"tcp://127.0.0.1:5557": "engine"})
        app.state.kv_events = SimpleNamespace(ledger=ledger, running=False)
        return families(app.state.ingest.metrics.registry)


def all_metrics() -> dict[str, list[tuple[str, str, str, str]]]:
    from kvscope.connector.cpu_offload.connector import CpuOffloadConnector
    from kvscope.connector.p2p.connector import P2PConnector

    return {
        "CPU offload connector (vLLM's /metrics)": connector_families(CpuOffloadConnector),
        "P2P connector (vLLM's /metrics)": connector_families(P2PConnector),
        "Backend (the backend's /metrics)": backend_families(),
    }


def miss_reasons() -> str:
    """The `reason` label of kvscope_backend_missed_tokens_total: the backend's vocabulary."""
    from kvscope.backend.queries.misses.vocabulary import REASONS

    rows = [(code(reason), meaning) for reason, meaning in REASONS.items()]
    return (
        "## Miss reasons\n\nThe values of `reason` on `kvscope_backend_missed_tokens_total` (and"
        " in `/api/v1/stats/misses`), in the order a prompt meets them; a request's reasons add up"
        " to its prompt tokens less what a tier served.\n\n" + table(("reason", "meaning"), rows)
    )


def render() -> str:
    parts = [
        f"## {title}\n\n"
        + table(
            ("metric", "type", "labels", "meaning"),
            [(code(name), type_, labels, doc) for name, type_, labels, doc in rows],
        )
        for title, rows in all_metrics().items()
    ]
    return page(
        "Prometheus metrics",
        "Every metric family, collected from the registries the code builds: each connector's"
        " `build_prom_metrics` as vLLM calls it (its samples carry vLLM's labels `model_name` and"
        " `engine` too, not listed; a `KvscopeMultiConnector` shows each child's), and the"
        " registry of the backend's `create_app`. Counters are shown with the `_total` a scrape"
        " shows; histograms add `_bucket`, `_sum` and `_count`.",
        *parts,
        miss_reasons(),
    )
