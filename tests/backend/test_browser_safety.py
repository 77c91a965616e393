"""A web page cannot reach the backend: foreign Origins and rebinding Hosts are refused on HTTP
and WebSocket; the WebSocket token stays out of URLs and uvicorn's log (real uvicorn, real
WebSocket client, real HTTP requests)."""

import base64
import os
import socket
import subprocess
import sys
import time
import uuid

import httpx
import pytest
from opentelemetry.sdk.trace.export import SpanExportResult
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from kvscope.backend.routes.ws import SUBPROTOCOL, token_subprotocol
from kvscope.backend.settings import Settings, check_bind_is_safe
from kvscope.harness.engine import free_port
from kvscope.traces import names
from tests.backend.conftest import otlp_json
from tests.backend.story import Process

EVIL = "http://evil.example"
TOKEN = "s3cret-" + uuid.uuid4().hex


def _spans(engine_id: str) -> list:
    process = Process("vllm-prefill", engine_id, "scheduler")
    now = time.time_ns()
    request = process.start(names.SPAN_REQUEST, now, **{names.REQUEST_ID: "req-1"})
    request.end(end_time=now + 1000)
    return process.spans()


def _ws_url(backend) -> str:
    return backend.url.replace("http://", "ws://") + "/ws"


def _stored(backend, engine_id: str) -> int:
    with backend.client() as client:
        answer = client.get("/api/v1/requests", params={"engine_id": engine_id})
        return answer.json()["total"]


@pytest.fixture
def sqlite_backend(make_backend, database_url):
    if not database_url.startswith("sqlite"):
        pytest.skip("the browser guard does not depend on the database")
    return make_backend


def test_a_foreign_origin_cannot_post_spans_or_read_the_api(sqlite_backend):
    backend = sqlite_backend()
    engine_id = f"engine-{uuid.uuid4().hex[:6]}"
    body = otlp_json(_spans(engine_id))
    with httpx.Client(base_url=backend.url, timeout=10) as client:
        refused = client.post("/v1/traces", json=body, headers={"Origin": EVIL})
        assert refused.status_code == 403
        assert "KVSCOPE_BACKEND_ALLOWED_ORIGINS" in refused.json()["detail"]
        assert client.get("/api/v1/requests", headers={"Origin": EVIL}).status_code == 403
        # A program (no Origin), the backend's own pages and the dashboard's origin pass.
        assert client.post("/v1/traces", json=body).status_code == 200
        assert client.get("/api/v1/requests", headers={"Origin": backend.url}).status_code == 200
        dashboard = {"Origin": "http://localhost:8501"}
        assert client.get("/api/v1/requests", headers=dashboard).status_code == 200
    assert _stored(backend, engine_id) == 1


def test_an_allow_list_admits_an_origin_of_your_own(sqlite_backend):
    backend = sqlite_backend(allowed_origins="https://grafana.internal:3000")
    with httpx.Client(base_url=backend.url, timeout=10) as client:
        ours = client.get("/health", headers={"Origin": "https://grafana.internal:3000"})
        assert ours.status_code == 200
        assert client.get("/health", headers={"Origin": EVIL}).status_code == 403


def test_a_dns_rebinding_host_is_refused_without_a_token(sqlite_backend):
    backend = sqlite_backend()
    port = backend.url.rsplit(":", 1)[1]
    with httpx.Client(base_url=backend.url, timeout=10) as client:
        # The page's own origin, now resolving to 127.0.0.1: same-origin, so no Origin on GET.
        rebound = client.get("/api/v1/requests", headers={"Host": f"evil.example:{port}"})
        assert rebound.status_code == 403 and "Host" in rebound.json()["detail"]
        assert client.get("/api/v1/requests", headers={"Host": f"localhost:{port}"}).is_success
    with_token = sqlite_backend(token=TOKEN)
    with httpx.Client(base_url=with_token.url, timeout=10) as client:
        # With a token the page gets nothing either: it does not know it.
        assert client.get("/api/v1/requests", headers={"Host": "evil.example"}).status_code == 401


def test_a_foreign_origin_cannot_open_the_websocket(sqlite_backend):
    backend = sqlite_backend()
    with pytest.raises(InvalidStatus) as refused:
        connect(_ws_url(backend), origin=EVIL, open_timeout=5)
    assert refused.value.response.status_code == 403
    with connect(_ws_url(backend), open_timeout=5) as websocket:  # a program: no Origin
        assert '"hello"' in websocket.recv(timeout=5)
    with connect(_ws_url(backend), origin=backend.url, open_timeout=5) as websocket:
        assert '"hello"' in websocket.recv(timeout=5)


def test_the_websocket_takes_its_token_from_a_header_or_subprotocol_never_the_url(
    sqlite_backend,
):
    backend = sqlite_backend(token=TOKEN)
    header = {"Authorization": f"Bearer {TOKEN}"}
    with connect(_ws_url(backend), additional_headers=header, open_timeout=5) as websocket:
        assert '"hello"' in websocket.recv(timeout=5)
    offered = [SUBPROTOCOL, token_subprotocol(TOKEN)]
    with connect(_ws_url(backend), subprotocols=offered, open_timeout=5) as websocket:
        assert websocket.subprotocol == SUBPROTOCOL  # never echoes the token's
        assert '"hello"' in websocket.recv(timeout=5)
    for refused in (
        {"uri": _ws_url(backend) + f"?token={TOKEN}"},
        {"uri": _ws_url(backend), "subprotocols": [SUBPROTOCOL, token_subprotocol("wrong")]},
        {"uri": _ws_url(backend)},
    ):
        with pytest.raises(InvalidStatus):
            connect(open_timeout=5, **refused)
    assert base64.urlsafe_b64decode(token_subprotocol("x").rsplit(".", 1)[1] + "==") == b"x"


def _uvicorn_factory(tmp_path, host: str, env: dict) -> subprocess.Popen:
    """`uvicorn --factory kvscope.backend.main:create_app`, as an operator may start it."""
    port = free_port()
    command = [sys.executable, "-m", "uvicorn", "--factory", "kvscope.backend.main:create_app"]
    environment = {
        **os.environ,
        "DATABASE_URL": f"sqlite:///{tmp_path}/factory.db",
        "KVSCOPE_BACKEND_INGEST_WORKERS": "0",
        **env,
    }
    process = subprocess.Popen(
        [*command, "--host", host, "--port", str(port)],
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    process.port = port
    return process


def _wait_serving(process, port: int) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and process.poll() is None:
        try:
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=1)
            return
        except httpx.TransportError:
            time.sleep(0.1)
    raise AssertionError(f"uvicorn did not serve: {process.communicate(timeout=5)[0]}")


def test_uvicorn_access_log_never_shows_the_websocket_token(sqlite_backend, tmp_path):
    server = _uvicorn_factory(tmp_path, "127.0.0.1", {"KVSCOPE_BACKEND_TOKEN": TOKEN})
    try:
        _wait_serving(server, server.port)
        url = f"ws://127.0.0.1:{server.port}/ws"
        offered = [SUBPROTOCOL, token_subprotocol(TOKEN)]
        with connect(url, subprotocols=offered, open_timeout=5) as websocket:
            websocket.recv(timeout=5)
        with pytest.raises(InvalidStatus):  # an old client's URL token: refused, and...
            connect(url + f"?token={TOKEN}", open_timeout=5)
        httpx.get(f"http://127.0.0.1:{server.port}/health?token={TOKEN}", timeout=5)
    finally:
        server.terminate()
        log = server.communicate(timeout=20)[0]
    assert '"WebSocket /ws" [accepted]' in log  # the log is there, at info level...
    assert "token=[redacted]" in log and "/health?token=[redacted]" in log
    assert TOKEN not in log  # ...and never holds the token


def test_a_factory_start_checks_the_bind_and_refuses_the_placeholder(sqlite_backend, tmp_path):
    env = {"KVSCOPE_BACKEND_HOST": "0.0.0.0", "KVSCOPE_BACKEND_TOKEN": "change-me"}
    refused = _uvicorn_factory(tmp_path, "0.0.0.0", env)
    output = refused.communicate(timeout=60)[0]
    assert refused.returncode != 0 and "placeholder token" in output
    with pytest.raises(SystemExit, match="placeholder"):
        check_bind_is_safe(Settings(database_url="sqlite:///x.db", token="change-me"), "0.0.0.0")
    check_bind_is_safe(Settings(database_url="sqlite:///x.db", token="change-me"), "127.0.0.1")


def _external_address() -> str | None:
    """This machine's address on its default route (no packet is sent), if it has one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("10.255.255.255", 1))
            address = probe.getsockname()[0]
        except OSError:
            return None
    return None if address.startswith("127.") else address


def test_a_tokenless_factory_bound_everywhere_answers_only_loopback(sqlite_backend, tmp_path):
    address = _external_address()
    if address is None:
        pytest.skip("this machine has no non-loopback address to test from")
    server = _uvicorn_factory(tmp_path, "0.0.0.0", {})  # KVSCOPE_BACKEND_HOST not told
    try:
        _wait_serving(server, server.port)
        outside = httpx.get(f"http://{address}:{server.port}/api/v1/requests", timeout=5)
        assert outside.status_code == 403 and "KVSCOPE_BACKEND_TOKEN" in outside.text
        inside = httpx.get(f"http://127.0.0.1:{server.port}/api/v1/requests", timeout=5)
        assert inside.status_code == 200
    finally:
        server.terminate()
        server.communicate(timeout=20)


def test_stored_spans_come_from_programs_not_pages(sqlite_backend):
    backend = sqlite_backend()
    engine_id = f"engine-{uuid.uuid4().hex[:6]}"
    assert backend.export(_spans(engine_id)) == SpanExportResult.SUCCESS  # the SDK sends none
    assert _stored(backend, engine_id) == 1
