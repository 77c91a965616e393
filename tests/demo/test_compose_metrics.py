"""Every metric the provisioned Grafana dashboard queries exists in real /metrics outputs: a
`vllm serve` with compose's connector config (the Multi: P2P, then the offload pool) sending its
spans to a real backend, after traffic. The Multi also carries its offload child's KV events."""

import json
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from vllm.distributed.kv_events import BlockStored

from kvscope.backend.settings import Settings
from kvscope.harness.configs import demo_config
from kvscope.harness.engine import ServerProcess, engine_env, free_port, serve_command
from tests.backend.conftest import RunningBackend
from tests.connector.cpu_offload.test_offload_serve_metrics import TOPIC, EventSubscriber, complete
from tests.demo.compose_files import dashboard_metrics

pytestmark = [pytest.mark.engine, pytest.mark.slow, pytest.mark.timeout(500)]
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}


@pytest.fixture(scope="module")
def stack(tiny_model, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("compose-metrics")
    (workdir / "faults.json").write_text("{}")
    settings = Settings(database_url=f"sqlite:///{workdir}/kvscope.db", ingest_workers=0)
    events_port, port = free_port(), free_port()
    events = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"tcp://*:{events_port}",
        "topic": TOPIC,
    }
    config = demo_config(free_port(), workdir / "faults.json")
    cmd = serve_command(tiny_model, port, config) + ["--kv-events-config", json.dumps(events)]
    subscriber = EventSubscriber(events_port)
    with RunningBackend(settings) as backend:
        env = engine_env(
            KVSCOPE_OTLP_ENDPOINTS=backend.url + "/v1/traces",
            KVSCOPE_BACKEND_URL=backend.url,
            OTEL_BSP_SCHEDULE_DELAY="100",
        )
        server = ServerProcess(cmd, port, env, workdir / "vllm.log")
        try:
            server.wait_ready(400)
            complete(server.url, tiny_model)
            complete(server.url, tiny_model)
            time.sleep(2.0)  # the spans' batch reaches the backend, the stores commit
            yield server, backend, subscriber
        finally:
            server.stop()
            subscriber.close()


def exposed(url: str) -> set[str]:
    """Every name a query may use: sample names, and each family's suffixed names (a family
    that has no sample yet, such as a gauge per stream before the first span, still counts)."""
    text = httpx.get(url + "/metrics", timeout=10).text
    names = set()
    for family in text_string_to_metric_families(text):
        names |= {family.name} | {s.name for s in family.samples}
        names |= {family.name + suffix for suffix in SUFFIXES.get(family.type, ())}
    return names


def test_every_metric_the_grafana_dashboard_queries_exists(stack):
    server, backend, _ = stack
    found = exposed(server.url) | exposed(backend.url)
    missing = sorted(dashboard_metrics() - found)
    assert not missing, f"the dashboard queries metrics no /metrics has: {missing}"


def test_the_multi_carries_its_offload_childs_metrics_and_events(stack):
    server, _, subscriber = stack
    text = httpx.get(server.url + "/metrics", timeout=10).text
    stored = [
        s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == "vllm:kvscope_offload_stored_blocks_total"
    ]
    assert stored and sum(stored) > 0
    events = subscriber.drain(timeout_s=3)
    assert any(isinstance(e, BlockStored) and e.medium == "CPU" for e in events)
