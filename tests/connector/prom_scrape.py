"""Prometheus samples as a scraper reads them (prometheus_client's parser): from a registry in
the test process, or from a vLLM server's /metrics."""

import functools
import time

import httpx
import prometheus_client
from prometheus_client.parser import text_string_to_metric_families


def parsed(text: str) -> dict[str, list[tuple[dict, float]]]:
    """{sample name: [(labels, value), ...]} of a /metrics text."""
    found: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, []).append((sample.labels, sample.value))
    return found


def registry_types() -> tuple[prometheus_client.CollectorRegistry, dict]:
    """A fresh registry and the metric classes bound to it, as vLLM hands metric_types over."""
    registry = prometheus_client.CollectorRegistry()
    kinds = (prometheus_client.Gauge, prometheus_client.Counter, prometheus_client.Histogram)
    return registry, {kind: functools.partial(kind, registry=registry) for kind in kinds}


def scrape_registry(registry: prometheus_client.CollectorRegistry) -> dict[str, list]:
    return parsed(prometheus_client.generate_latest(registry).decode())


def scrape_server(url: str) -> dict[str, list]:
    return parsed(httpx.get(url + "/metrics", timeout=10).text)


def exactly(found: dict, name: str, **labels: str) -> float:
    """The value of the one sample of `name` with exactly these labels."""
    (value,) = [v for got, v in found[name] if got == labels]
    return value


def total(found: dict, name: str, **labels: str) -> float:
    """The sum of the samples of `name` whose labels include these."""
    return sum(v for got, v in found.get(name, []) if labels.items() <= got.items())


def wait_for(
    url: str, name: str, timeout_s: float = 30, at_least: float = 1, **labels: str
) -> dict:
    """The server's samples once `name` (with these labels) reached at_least."""
    deadline = time.monotonic() + timeout_s
    while total(found := scrape_server(url), name, **labels) < at_least:
        assert time.monotonic() < deadline, (
            f"{name} {labels} is {total(found, name, **labels)} after {timeout_s} s,"
            f" expected at least {at_least}"
        )
        time.sleep(0.5)
    return found
