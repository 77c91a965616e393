"""The backend's KV-event subscriber against a real `vllm serve` (offload connector, ZMQ events,
spans to the same backend): no divergence on a healthy run, a subscriber that joined late reports
the batches it missed, and a publisher restart is seen and its dead claims dropped."""

import json
import time
from functools import partial

import httpx
import pytest

from kvscope.backend.settings import Settings
from kvscope.harness.configs import offload_config
from kvscope.harness.engine import ServerProcess, engine_env, free_port, serve_command
from kvscope.harness.prompts import long_prompt
from tests.backend.conftest import RunningBackend
from tests.connector.prom_scrape import parsed, total

pytestmark = [pytest.mark.engine, pytest.mark.slow, pytest.mark.timeout(500)]
OFFLOAD = offload_config("fail", cpu_bytes_to_use=64 << 20)


@pytest.fixture(scope="module")
def stack(tiny_model, tmp_path_factory):
    """A backend subscribed to the server's KV events, and the server exporting spans to it."""
    workdir = tmp_path_factory.mktemp("kv-events")
    events_port, port = free_port(), free_port()
    database = f"sqlite:///{workdir / 'kvscope.db'}"
    endpoint = f"tcp://127.0.0.1:{events_port}"
    settings = Settings(database_url=database, kv_events=endpoint, ingest_workers=0)
    events = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"tcp://*:{events_port}",
        "topic": "kv-events",
    }
    cmd = serve_command(tiny_model, port, OFFLOAD) + ["--kv-events-config", json.dumps(events)]
    with RunningBackend(settings) as backend:
        env = engine_env(
            KVSCOPE_OTLP_ENDPOINTS=f"{backend.url}/v1/traces", OTEL_BSP_SCHEDULE_DELAY="100"
        )
        wait_listening(backend)
        servers = [ServerProcess(cmd, port, env, workdir / "vllm.log")]
        try:
            servers[0].wait_ready(300)
            restart = partial(restarted, servers, cmd, port, env, workdir)
            yield backend, servers[0], settings, restart
        finally:
            servers[-1].stop()


def restarted(servers: list, cmd: list, port: int, env: dict, workdir) -> ServerProcess:
    """The server stopped and started again on the same ports: its event seqs begin at 0."""
    servers[-1].stop()
    servers.append(ServerProcess(cmd, port, env, workdir / f"vllm-{len(servers)}.log"))
    servers[-1].wait_ready(300)
    return servers[-1]


def wait_listening(backend: RunningBackend, timeout_s: float = 120.0) -> None:
    """Until the backend's subscriber has imported vLLM's event types and connected."""
    deadline = time.monotonic() + timeout_s
    with backend.client() as client:
        while not client.get("/api/v1/kv-events/divergence").json()["running"]:
            assert time.monotonic() < deadline, "the subscriber never started"
            time.sleep(0.2)
    time.sleep(0.5)  # ZMQ's connect completes in the background


def complete(server: ServerProcess, model, prompt: str) -> None:
    body = {"model": str(model), "prompt": prompt, "max_tokens": 4, "temperature": 0}
    httpx.post(server.url + "/v1/completions", json=body, timeout=60).raise_for_status()


def host_tier(found: dict) -> dict | None:
    engines = found["engines"]
    tiers = [t for t in engines[0]["tiers"] if t["tier"] == "host"] if engines else []
    return tiers[0] if tiers else None


def settled(backend: RunningBackend, timeout_s: float = 30.0) -> dict:
    """The divergence once the host tier's two counts stop changing (spans arrive later)."""
    deadline, last = time.monotonic() + timeout_s, None
    with backend.client() as client:
        while time.monotonic() < deadline:
            found = client.get("/api/v1/kv-events/divergence").raise_for_status().json()
            tier = host_tier(found)
            now = (tier["claimed"], tier["held_by_spans"]) if tier else None
            if now is not None and now == last and now[0] > 0 and now[0] == now[1]:
                return found
            last = now
            time.sleep(1.0)
    return found


@pytest.fixture(scope="module")
def healthy(stack, tiny_model):
    backend, server, _, _ = stack
    for i in range(2):
        complete(server, tiny_model, long_prompt(i, sentences=6))
    complete(server, tiny_model, "one more step: the last stores report")
    return settled(backend)


def test_a_healthy_run_has_no_divergence(healthy, stack):
    backend, _, _, _ = stack
    assert healthy["enabled"] and healthy["running"]
    (engine,) = healthy["engines"]
    assert engine["engine_id"], engine  # the only engine whose spans hold host blocks
    host = host_tier(healthy)
    assert host["claimed"] > 0 and host["claimed"] == host["held_by_spans"], engine
    assert host["only_in_events"] == 0 and host["only_in_spans"] == 0
    assert engine["missed_batches"] == 0 and engine["seq_gaps"] == []
    assert engine["undecodable"] == 0 and not engine["divergent"]
    device = [t for t in engine["tiers"] if t["tier"] == "device"]
    assert device and device[0]["held_by_spans"] is None  # vLLM's own GPU cache: events only

    with backend.client() as client:
        found = parsed(client.get("/metrics").text)
    labels = {"tier": "host", "engine_id": engine["engine_id"]}
    name = "kvscope_backend_kv_events_"
    assert total(found, name + "claimed_blocks", **labels) == host["claimed"]
    assert total(found, name + "span_blocks", **labels) == host["held_by_spans"]
    assert total(found, name + "divergent_blocks", **labels) == 0
    assert total(found, name + "missed_batches") == 0


def test_a_late_subscriber_reports_the_batches_it_missed(healthy, stack, tiny_model):
    backend, server, settings, _ = stack
    # A second backend on the same database whose subscriber starts now, as after a restart.
    with RunningBackend(settings) as late:
        wait_listening(late)
        complete(server, tiny_model, "A late subscriber: " + long_prompt(3, sentences=5))
        deadline = time.monotonic() + 30
        with late.client() as client:
            while time.monotonic() < deadline:
                found = client.get("/api/v1/kv-events/divergence").json()
                if found["engines"][0]["batches"] > 0:
                    break
                time.sleep(0.5)
        (engine,) = found["engines"]
    assert engine["missed_batches"] > 0, engine
    gap = engine["seq_gaps"][0]
    assert gap["first_seq"] == 0 and gap["why"] == "published before the subscriber connected"
    assert gap["missed"] == engine["missed_batches"]
    assert engine["divergent"]
    host = host_tier(found)
    assert host is not None and host["only_in_spans"] > 0  # blocks stored before it listened
    assert host_tier(settled(backend))["only_in_events"] == 0  # the first one still agrees


def test_a_publisher_restart_is_seen_and_its_old_claims_dropped(healthy, stack, tiny_model):
    backend, _, _, restart = stack
    before = settled(backend)["engines"][0]
    server = restart()
    complete(server, tiny_model, "After the restart: " + long_prompt(4, sentences=4))
    deadline = time.monotonic() + 30
    with backend.client() as client:
        while time.monotonic() < deadline:
            engine = client.get("/api/v1/kv-events/divergence").json()["engines"][0]
            if engine["restarts"] > 0:
                break
            time.sleep(0.5)
    assert engine["restarts"] == 1, engine
    assert engine["last_seq"] < before["last_seq"]  # the new process counts from 0 again
    claimed = {t["tier"]: t["claimed"] for t in engine["tiers"]}
    old = {t["tier"]: t["claimed"] for t in before["tiers"]}
    assert claimed.get("device", 0) < old["device"]  # the dead process's blocks are not claimed
