"""A `vllm serve` with the offload connector after real traffic: its /metrics (read with
prometheus_client's parser) has the kvscope families with non-zero values, and its KV event
stream (ZMQ, decoded with msgspec as vLLM encodes it) carries the host tier's BlockStored."""

import json
import time

import httpx
import msgspec
import pytest
import zmq
from vllm.distributed.kv_events import BlockStored, KVEventBatch

from kvscope.harness.configs import offload_config
from kvscope.harness.engine import ServerProcess, engine_env, free_port, serve_command
from kvscope.harness.prompts import long_prompt
from tests.connector.prom_scrape import total, wait_for

pytestmark = [pytest.mark.engine, pytest.mark.slow, pytest.mark.timeout(400)]
PROMPT = long_prompt(2, sentences=6)
TOPIC = "kv-events"
OFFLOAD = offload_config("fail", cpu_bytes_to_use=64 << 20)  # vLLM's default load-failure policy


class EventSubscriber:
    """vLLM's publisher binds (a tcp://*:PORT endpoint); this SUB socket connects to it."""

    def __init__(self, port: int) -> None:
        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.SUB)
        self.socket.setsockopt_string(zmq.SUBSCRIBE, TOPIC)
        self.socket.connect(f"tcp://127.0.0.1:{port}")
        self.events: list = []

    def drain(self, timeout_s: float) -> list:
        """Every event received within timeout_s, added to self.events."""
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            if not self.socket.poll(int(left * 1000)):
                break
            topic, _seq, payload = self.socket.recv_multipart()
            assert topic == TOPIC.encode()
            self.events += msgspec.msgpack.decode(payload, type=KVEventBatch).events
        return self.events

    def close(self) -> None:
        self.socket.close(linger=0)
        self.context.term()


@pytest.fixture(scope="module")
def served(tiny_model, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("offload-serve")
    events_port, port = free_port(), free_port()
    events = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"tcp://*:{events_port}",
        "topic": TOPIC,
    }
    cmd = serve_command(tiny_model, port, OFFLOAD) + ["--kv-events-config", json.dumps(events)]
    subscriber = EventSubscriber(events_port)
    server = ServerProcess(cmd, port, engine_env(VLLM_SERVER_DEV_MODE="1"), workdir / "vllm.log")
    try:
        server.wait_ready(300)
        yield server, subscriber
    finally:
        server.stop()
        subscriber.close()


def complete(url: str, model) -> None:
    body = {"model": str(model), "prompt": PROMPT, "max_tokens": 4, "temperature": 0}
    httpx.post(url + "/v1/completions", json=body, timeout=60).raise_for_status()


@pytest.fixture(scope="module")
def traffic(served, tiny_model):
    """One prompt stored to the host pool, then served from it with the GPU prefix cache empty."""
    server, _ = served
    complete(server.url, tiny_model)
    wait_for(server.url, "vllm:kvscope_offload_stored_blocks_total")
    complete(server.url, tiny_model)  # one more step: the stores' last reports arrive
    httpx.post(server.url + "/reset_prefix_cache", timeout=30).raise_for_status()
    complete(server.url, tiny_model)
    return wait_for(server.url, "vllm:kvscope_offload_loaded_blocks_total")


def test_metrics_has_the_kvscope_families_with_vllms_labels(served, traffic):
    found = traffic
    for name in (
        "lookups_total",
        "hit_tokens_total",
        "miss_tokens_total",
        "stored_blocks_total",
        "loaded_blocks_total",
        "host_blocks",
        "host_blocks_used",
        "transfer_seconds_count",
        "transfer_size_bytes_sum",
        "kv_wait_seconds_count",
    ):
        assert total(found, "vllm:kvscope_offload_" + name) > 0, name
    for path in ("store", "load"):
        assert total(found, "vllm:kvscope_offload_bytes_total", path=path) > 0, path
        assert total(found, "vllm:kvscope_offload_transfer_seconds_count", path=path) > 0, path
    labels, _ = found["vllm:kvscope_offload_lookups_total"][0]
    assert set(labels) == {"model_name", "engine"}
    assert "vllm:kvscope_offload_failures_total" in found  # every cause and outcome, from 0


def test_the_event_stream_carries_the_host_tiers_blocks(served, traffic):
    _, subscriber = served
    events = subscriber.drain(timeout_s=3)
    stored = [e for e in events if isinstance(e, BlockStored)]
    host = {h for e in stored if e.medium == "CPU" for h in e.block_hashes}
    gpu = {h for e in stored if e.medium == "GPU" for h in e.block_hashes}
    assert host, f"no host-tier BlockStored among {len(events)} events"
    assert host <= gpu, "the host tier announces the blocks under vLLM's own hashes"
