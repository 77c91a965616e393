"""Shared fixtures: the tiny model, the run's one oracle, one in-memory span exporter per
session, engine environment."""

import os
from pathlib import Path

# UCX on the loopback device for every NIXL agent the tests start, in this process and its
# children: set before any test module imports NIXL (UCX reads it when an agent starts).
os.environ.setdefault("UCX_NET_DEVICES", "lo")

import pytest  # noqa: E402

from kvscope.harness.engine import use_in_process_engine
from tests.oracle_cache import Oracle

# Engines in tests run in-process unless a test starts a subprocess on purpose.
use_in_process_engine()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On a vLLM that runs no engine here (the 0.34 lane), engine tests skip saying why."""
    from tests.vllm_release import NO_PLATFORM, NO_PLATFORM_REASON

    if NO_PLATFORM:
        skip = pytest.mark.skip(reason=NO_PLATFORM_REASON)
        for item in items:
            if "engine" in item.keywords:
                item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default tiny model, built once per test session."""
    from kvscope.model.build import build_model

    return build_model(tmp_path_factory.mktemp("models") / "tiny-seed0")


@pytest.fixture(scope="session")
def oracle(tiny_model: Path, request: pytest.FixtureRequest) -> Oracle:
    """Greedy tokens without a connector, one baseline engine per TP for the whole run (and
    pytest's cache across runs): ask it in a fixture before the test's own engine starts."""
    return Oracle(tiny_model, getattr(request.config, "cache", None))


@pytest.fixture(scope="session")
def span_exporter():
    """The process's in-memory span exporter (tracing is set up once per process)."""
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from kvscope.traces.sdk.configure import add_exporter, configure_tracing
    from kvscope.traces.sdk.settings import TracingSettings

    exporter = InMemorySpanExporter()
    settings = TracingSettings(schedule_delay_s=0.05)
    # Something in this process (kvscope verify's collector) may have set tracing up first.
    if not configure_tracing(settings, exporters=[exporter]):
        add_exporter(exporter, settings)
    return exporter


@pytest.fixture
def spans(span_exporter):
    """Finished spans of this test: call it after the work to get them, flushed."""
    from kvscope.traces.sdk.configure import flush

    span_exporter.clear()

    def collect():
        flush()
        return list(span_exporter.get_finished_spans())

    return collect
