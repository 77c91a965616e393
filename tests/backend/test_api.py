"""The read API a dashboard uses: filters and paging, summary, live WebSocket, retention."""

import json
import threading
import time
import uuid

import pytest
from opentelemetry.sdk.trace.export import SpanExportResult
from websockets.sync.client import connect

from kvscope.backend.db.migrations import latest_version
from kvscope.backend.main import create_app
from kvscope.backend.settings import Settings, check_bind_is_safe

from .story import Process, failure_story, load_story

pytestmark = pytest.mark.timeout(60)


def _stories(count: int, engine_id: str, t0: int) -> list:
    scheduler, worker = Process("s", engine_id, "scheduler"), Process("w", engine_id, "worker")
    api = Process("api", engine_id, "api")
    for index in range(count):
        load_story(
            scheduler, worker, api, f"req-{index}-abcdef12", t0 + index * 10**8, lease_id=index
        )
    failure_story(scheduler, worker, "req-failed", t0 + count * 10**8)
    return scheduler.spans() + worker.spans() + api.spans()


def test_requests_filter_by_engine_time_status_and_page(backend):
    engine_id = f"engine-{uuid.uuid4().hex[:6]}"
    t0 = time.time_ns()
    assert backend.export(_stories(5, engine_id, t0)) == SpanExportResult.SUCCESS
    with backend.client() as client:
        everything = client.get("/api/v1/requests", params={"engine_id": engine_id}).json()
        assert everything["total"] == 6
        starts = [r["start_ns"] for r in everything["items"]]
        assert starts == sorted(starts, reverse=True)  # newest first
        page = client.get(
            "/api/v1/requests", params={"engine_id": engine_id, "offset": 2, "limit": 2}
        ).json()
        assert [r["id"] for r in page["items"]] == [r["id"] for r in everything["items"][2:4]]
        window = client.get(
            "/api/v1/requests",
            params={"engine_id": engine_id, "since_ns": t0 + 10**8, "until_ns": t0 + 3 * 10**8},
        ).json()
        assert sorted(r["request_id"] for r in window["items"]) == [
            "req-1-abcdef12",
            "req-2-abcdef12",
        ]
        by_connector = client.get(
            "/api/v1/requests",
            params={
                "engine_id": engine_id,
                "connector": "CPUOffloadConnector",
                "status": "finished_stopped",
            },
        ).json()
        assert by_connector["total"] == 6
        assert (
            client.get(
                "/api/v1/requests", params={"engine_id": engine_id, "connector": "NixlConnector"}
            ).json()["total"]
            == 0
        )
        assert client.get("/api/v1/requests/999999999").status_code == 404
        assert client.get("/api/v1/requests", params={"limit": 0}).status_code == 422


def test_summary_counts_the_window(make_backend):
    backend = make_backend()
    engine_id = f"engine-{uuid.uuid4().hex[:6]}"
    assert backend.export(_stories(3, engine_id, time.time_ns())) == SpanExportResult.SUCCESS
    with backend.client() as client:
        summary = client.get("/api/v1/stats/summary", params={"window_s": 60}).json()
    assert summary["requests"] == {"finished_stopped": 4}
    assert summary["ttft_ms_p50"] == pytest.approx(40.0)
    assert summary["transfers"]["load"]["count"] == 3
    assert summary["transfers"]["load"]["bytes"] == 3 * (1 << 20)
    assert summary["transfers"]["p2p_read"]["failed"] == 1
    # One incident: the failed transfer, the load failure and the lease it outran.
    assert summary["failures"] == {"load_failed": 1}
    assert summary["blocks"]["host"] == {
        "stored": 2,
        "evicted": 1,
    }
    assert summary["external_hit_tokens"] == 3 * 64 + 32
    assert summary["streams_incomplete"] == 0


def test_websocket_pushes_batches_and_finished_timelines(backend):
    engine_id = f"engine-{uuid.uuid4().hex[:6]}"
    ws_url = backend.url.replace("http://", "ws://") + "/ws"
    with connect(ws_url, open_timeout=5) as websocket:
        assert json.loads(websocket.recv(timeout=5))["type"] == "hello"
        assert backend.export(_stories(1, engine_id, time.time_ns())) == SpanExportResult.SUCCESS
        seen: dict[str, list] = {}
        deadline = time.monotonic() + 10
        while "timeline" not in seen and time.monotonic() < deadline:
            message = json.loads(websocket.recv(timeout=5))
            seen.setdefault(message["type"], []).append(message)
    batch = seen["batch"][0]
    assert any(b["engine_id"] == engine_id for b in batch["blocks"])
    timelines = [m["timeline"] for m in seen["timeline"]]
    assert timelines[0]["request"]["engine_id"] == engine_id
    assert "transfer_complete" in timelines[0]["first"] or timelines[0]["failures"]


def test_retention_drops_the_oldest_spans_beyond_the_limit(make_backend):
    backend = make_backend(retention_max_spans=40, retention_interval_s=0.0)
    old, new = (f"engine-{uuid.uuid4().hex[:6]}" for _ in range(2))
    assert backend.export(_stories(2, old, time.time_ns() - 10**9)) == SpanExportResult.SUCCESS
    newer_spans = _stories(3, new, time.time_ns())
    assert len(newer_spans) > 40
    assert backend.export(newer_spans) == SpanExportResult.SUCCESS
    with backend.client() as client:
        summary = client.get("/api/v1/stats/summary", params={"window_s": 3600}).json()
        assert summary["spans"] == 40
        newest = client.get("/api/v1/requests", params={"engine_id": new}).json()
        assert newest["total"] == 4  # the request rows outlive the spans they came from...
        oldest = client.get("/api/v1/requests", params={"engine_id": old}).json()
        assert oldest["total"] == 0  # ...until every span is newer than they are


def test_health_reports_the_database(backend):
    with backend.client() as client:
        health = client.get("/health").json()
    assert health["status"] == "ok" and health["schema_version"] == latest_version()


def test_refuses_a_public_address_without_a_token(tmp_path):
    with pytest.raises(SystemExit, match="KVSCOPE_BACKEND_TOKEN"):
        check_bind_is_safe(Settings(database_url="sqlite:///x.db"), "0.0.0.0")
    check_bind_is_safe(Settings(database_url="sqlite:///x.db", token="t"), "0.0.0.0")
    check_bind_is_safe(Settings(database_url="sqlite:///x.db"), "127.0.0.1")


def test_schema_is_created_once_and_reopened(tmp_path):
    url = f"sqlite:///{tmp_path}/reopen.db"
    create_app(Settings(database_url=url))
    threads = [threading.Thread(target=create_app, args=(Settings(database_url=url),))]
    for thread in threads:
        thread.start()
        thread.join(10)
    from sqlalchemy import create_engine, text

    with create_engine(url).connect() as connection:
        versions = connection.execute(text("SELECT version FROM kvscope_schema_version")).all()
    assert versions == [(latest_version(),)]
