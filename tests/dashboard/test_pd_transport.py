"""A real P/D pair of vLLM servers over real NIXL, UCX held to TCP: each read carries the lanes
UCX chose and is flagged TCP-staged; a request's TTFT split adds up; Chromium shows both."""

import time

import httpx
import pytest

from kvscope.bench.pd.pd_pair import PDPair
from kvscope.harness.prompts import long_prompt
from tests.connector.p2p.pd_client import completion_body, prefill_only, streamed_chunks

from .conftest import Dashboard, new_backend, screenshot
from .test_browser import open_page

pytestmark = [pytest.mark.engine, pytest.mark.slow, pytest.mark.timeout(900)]

MAX_TOKENS = 4
PROMPTS = [f"Transport case {i}: " + long_prompt(i, sentences=3) for i in range(3)]
CONNECTOR = {"lease_timeout_s": 30.0, "read_timeout_s": 10.0, "handshake_timeout_s": 8.0}
# Both servers on this host, UCX allowed only TCP: the memory-copy lane it would pick is gone.
TCP_ONLY = {"UCX_TLS": "tcp,self", "OTEL_BSP_SCHEDULE_DELAY": "100"}
OTLP_HTTP = {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"}


@pytest.fixture(scope="module")
def system(tiny_model, tmp_path_factory):
    """A backend, and a P/D pair exporting its spans to it; always stopped."""
    with new_backend(tmp_path_factory.mktemp("pd-transport-db")) as backend:
        env = {**TCP_ONLY, **OTLP_HTTP, "KVSCOPE_OTLP_ENDPOINTS": f"{backend.url}/v1/traces"}
        workdir = tmp_path_factory.mktemp("pd-transport")
        # vLLM's own spans too: its llm_request carries the TTFT it measured itself.
        otlp = ["--otlp-traces-endpoint", f"{backend.url}/v1/traces"]
        pair = PDPair(tiny_model, workdir, extra=CONNECTOR, env=env, serve_args=otlp).start(400)
        try:
            yield backend, pair
        finally:
            pair.stop()


def client_ttft_ms(pair: PDPair, body: dict) -> float:
    """The proxy's two legs by hand; the decode leg's time to its first streamed chunk."""
    params = prefill_only(pair.prefill.url, body)
    start = time.monotonic()
    chunks = streamed_chunks(pair.decode.url, {**body, "kv_transfer_params": params})
    next(chunks)
    ttft_ms = (time.monotonic() - start) * 1e3
    for _ in chunks:
        pass
    return ttft_ms


@pytest.fixture(scope="module")
def served(system, tiny_model):
    """The prompts served one at a time; each decode request's reads, split and client TTFT."""
    backend, pair = system
    measured = [client_ttft_ms(pair, completion_body(tiny_model, p, MAX_TOKENS)) for p in PROMPTS]
    with backend.client() as http:
        deadline = time.monotonic() + 60
        while True:
            reads = http.get("/api/v1/transport/reads", params={"window_s": 3600}).json()
            if len(reads) >= len(PROMPTS) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        reads.sort(key=lambda read: read["start_ns"])
        requests = [_decode_request(http, read["request_id"]) for read in reads]
        splits = [http.get(f"/api/v1/transport/requests/{r['id']}/split").json() for r in requests]
        summary = http.get("/api/v1/transport/summary", params={"window_s": 3600}).json()
    assert len(reads) == len(PROMPTS), reads
    return {"reads": reads, "requests": requests, "splits": splits, "ttft_ms": measured}, summary


def _decode_request(http: httpx.Client, request_id: str) -> dict:
    deadline = time.monotonic() + 30
    while True:
        found = http.get("/api/v1/requests", params={"request_id": request_id}).json()["items"]
        finished = [r for r in found if r["status"] != "running"]
        if finished or time.monotonic() > deadline:
            return (finished or found)[0]
        time.sleep(0.5)


def test_each_read_carries_the_lanes_ucx_really_used(served):
    found, _ = served
    for read in found["reads"]:
        assert read["ok"]
        assert read["backend"] == "UCX"
        assert read["ucx_lanes"] == ["tcp/lo"]  # UCX's own table, under UCX_TLS=tcp,self
        assert read["ucx_scope"] == "intra-node"  # UCX knows the peer shares this host
        assert read["memory"] == "DRAM"


def test_bytes_and_time_come_from_the_reads_own_window(served):
    found, _ = served
    for read in found["reads"]:
        assert read["window"] == "post_to_done"
        assert read["nixl_bytes"] == read["bytes"] > 0  # NIXL counted the same bytes
        nixl_ms = read["nixl_xfer_us"] / 1e3  # NIXL's own timer, inside our post .. DONE
        assert nixl_ms <= read["duration_ms"] + 0.05
        assert read["duration_ms"] - nixl_ms < 20
        assert read["gbps"] == pytest.approx(read["bytes"] / read["duration_ms"] / 1e6)


def test_reads_over_tcp_on_one_host_are_flagged_and_nothing_else(served):
    found, summary = served
    for read in found["reads"]:
        assert read["flags"] == ["tcp_staged"]  # small reads: not judged slow; none too fast
        assert read["gbps"] < read["line_gbps"]
    assert summary["flags"]["tcp_staged"] == len(PROMPTS)
    assert summary["lanes"] == {"tcp/lo": len(PROMPTS)}
    assert any("went over TCP" in warning for warning in summary["warnings"])


def test_the_split_adds_up_to_the_measured_ttft(served):
    """The parts add up to vLLM's own TTFT; the engine's timeline lies inside it, and vLLM's
    TTFT inside the time the client waited for its first chunk."""
    found, _ = served
    parts = ["server_ms", "queue_ms", "handshake_ms", "read_ms", "first_decode_step_ms"]
    for split, client_ms in zip(found["splits"], found["ttft_ms"], strict=True):
        assert split["missing"] == [] and all(split[p] >= 0 for p in parts), split
        assert sum(split[p] for p in parts) == pytest.approx(split["ttft_ms"], abs=1e-3)
        assert split["engine_ttft_ms"] <= split["ttft_ms"] <= client_ms
    first, *later = found["splits"]
    assert first["handshake_ms"] > 0  # the first request to the peer paid the handshake
    assert all(split["handshake_ms"] == 0 for split in later)


@pytest.fixture(scope="module")
def dashboard(system, served):
    backend, _ = system
    running = Dashboard(backend.url).wait_ready()
    yield running
    running.stop()


def test_requests_page_shows_the_split_and_the_reads_transport(page, dashboard, served):
    found, _ = served
    request = found["requests"][0]
    open_page(page, dashboard, f"requests?request={request['id']}", "P2P transport")
    page.get_by_text("P/D TTFT", exact=False).first.wait_for()
    page.get_by_text("handshake", exact=False).first.wait_for()
    page.get_by_text("TCP-staged", exact=False).first.wait_for()
    page.get_by_text("tcp/lo", exact=False).first.wait_for(state="attached")
    screenshot(page, "pd_transport_request")


def test_overview_warns_of_tcp_staged_reads_in_words(page, dashboard):
    open_page(page, dashboard, "", "Over time")
    sentence = f"P2P transport: {len(PROMPTS)} of {len(PROMPTS)} reads went over TCP"
    page.get_by_text(sentence, exact=False).wait_for()
    screenshot(page, "pd_transport_overview")
