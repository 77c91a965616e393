"""Spans from the real OTel SDK exporter arrive, are stored, and become request timelines."""

import time
import uuid

import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as pb
from opentelemetry.sdk.trace.export import SpanExportResult

from kvscope.traces import names

from ..conftest import otlp_json
from ..story import MS, Process, load_story

pytestmark = pytest.mark.timeout(60)


def _processes(engine_id: str):
    return (
        Process("vllm-engine", engine_id, "scheduler"),
        Process("vllm-worker", engine_id, "worker"),
        Process("vllm-api", engine_id, "api"),
    )


def _request(client, engine_id: str) -> dict:
    page = client.get("/api/v1/requests", params={"engine_id": engine_id}).json()
    assert page["total"] == 1, page
    return page["items"][0]


def test_protobuf_export_builds_the_full_timeline(backend):
    engine_id = f"engine-{uuid.uuid4().hex[:6]}"
    scheduler, worker, api = _processes(engine_id)
    t0 = time.time_ns()
    load_story(scheduler, worker, api, "cmpl-1-0-1a2b3c4d", t0)
    spans = scheduler.spans() + worker.spans() + api.spans()
    assert backend.export(spans) == SpanExportResult.SUCCESS

    with backend.client() as client:
        request = _request(client, engine_id)
        assert request["request_id"] == "cmpl-1-0-1a2b3c4d"
        assert request["status"] == "finished_stopped"
        assert request["connector"] == "CPUOffloadConnector"
        assert request["prompt_tokens"] == 96
        assert request["duration_ms"] == pytest.approx(31.0)
        timeline = client.get(f"/api/v1/requests/{request['id']}/timeline").json()
        stored = client.get(f"/api/v1/requests/{request['id']}/spans").json()

    assert timeline["missing_points"] == []
    first = timeline["first"]
    assert [p for p in names.TIMELINE_POINTS if p in first] == list(names.TIMELINE_POINTS)
    assert first["lookup_start"] == t0 + MS and first["lookup_result"] == t0 + 2 * MS
    assert first["transfer_complete"] == t0 + 15 * MS and first["resumed"] == t0 + 20 * MS
    layers = [p["layer"] for p in timeline["points"] if p["point"] == "layer_ready"]
    assert layers == [0, 1]
    ttft = timeline["ttft"]
    assert ttft["ttft_ms"] == pytest.approx(40.0)
    assert ttft["queue_ms"] == pytest.approx(0.5)
    assert ttft["lookup_ms"] == pytest.approx(1.0)
    assert ttft["kv_wait_ms"] == pytest.approx(11.0)  # blocks_allocated (4 ms) to 15 ms
    assert ttft["compute_ms"] == pytest.approx(27.5)
    [transfer] = timeline["transfers"]
    assert transfer["bytes"] == 1 << 20 and transfer["direction"] == "load"
    assert transfer["gbps"] == pytest.approx((1 << 20) / 5e6)
    assert timeline["certainty"]["complete"] is True
    hook_names = {s["name"] for s in stored}
    assert names.SPAN_REQUEST in hook_names and names.SPAN_WORKER_REQUEST in hook_names
    assert all(s["attributes"][names.SEQ] is not None for s in stored)


def test_json_encoding_is_accepted_and_answered_in_json(backend):
    engine_id = f"engine-{uuid.uuid4().hex[:6]}"
    scheduler, worker, _ = _processes(engine_id)
    load_story(scheduler, worker, None, "json-req-1", time.time_ns())
    with backend.client() as client:
        response = client.post("/v1/traces", json=otlp_json(scheduler.spans() + worker.spans()))
        assert response.status_code == 200, response.text
        assert response.headers["content-type"].startswith("application/json")
        assert response.json() == {}
        request = _request(client, engine_id)
        timeline = client.get(f"/api/v1/requests/{request['id']}/timeline").json()
    assert timeline["missing_points"] == []
    assert timeline["ttft"]["ttft_ms"] is None  # no vLLM llm_request span in this trace


def test_a_retried_export_is_stored_once(backend):
    engine_id = f"engine-{uuid.uuid4().hex[:6]}"
    scheduler, worker, _ = _processes(engine_id)
    load_story(scheduler, worker, None, "retry-req", time.time_ns())
    spans = scheduler.spans() + worker.spans()
    assert backend.export(spans) == SpanExportResult.SUCCESS
    assert backend.export(spans) == SpanExportResult.SUCCESS
    with backend.client() as client:
        request = _request(client, engine_id)
        timeline = client.get(f"/api/v1/requests/{request['id']}/timeline").json()
        stored = client.get(f"/api/v1/requests/{request['id']}/spans").json()
        transfers = client.get("/api/v1/transfers", params={"engine_id": engine_id}).json()
    assert len(stored) == len(
        [s for s in spans if s.context.trace_id == int(request["trace_id"], 16)]
    )
    assert len([p for p in timeline["points"] if p["point"] == "layer_ready"]) == 2
    assert transfers["total"] == 1


def test_protobuf_response_is_an_export_trace_service_response(backend):
    engine_id = f"engine-{uuid.uuid4().hex[:6]}"
    scheduler, worker, _ = _processes(engine_id)
    load_story(scheduler, worker, None, "pb-req", time.time_ns())
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    body = encode_spans(scheduler.spans()).SerializeToString()
    with backend.client() as client:
        response = client.post(
            "/v1/traces", content=body, headers={"Content-Type": "application/x-protobuf"}
        )
    assert response.status_code == 200
    parsed = pb.ExportTraceServiceResponse.FromString(response.content)
    assert not parsed.HasField("partial_success")


def test_a_composite_childs_hooks_make_no_request_of_their_own(backend):
    """A MultiConnector's child hook span hangs under the Multi's hook span: it marks the
    request running (before its span ends) through that parent, never adds a request row."""
    engine_id = f"engine-{uuid.uuid4().hex[:6]}"
    scheduler, _, _ = _processes(engine_id)
    t0 = time.time_ns()
    request = scheduler.start(names.SPAN_REQUEST, t0, **{names.REQUEST_ID: "multi-req"})
    lookup = scheduler.start(
        names.SPAN_HOOK_PREFIX + "get_num_new_matched_tokens",
        t0 + MS,
        request,
        **{names.REQUEST_ID: "multi-req"},
    )
    scheduler.hook(
        "get_num_new_matched_tokens",
        lookup,
        t0 + MS,
        t0 + 2 * MS,
        **{names.REQUEST_ID: "multi-req", names.CONNECTOR_CHILD: "offload"},
    )
    lookup.end(end_time=t0 + 2 * MS)
    assert backend.export(scheduler.spans()) == SpanExportResult.SUCCESS
    with backend.client() as client:
        running = _request(client, engine_id)
        assert running["status"] == "running" and running["span_id"] == request_span_id(request)
        request.set_attribute("kvscope.request.status", "FINISHED_LENGTH_CAPPED")
        request.end(end_time=t0 + 3 * MS)
        assert backend.export(scheduler.spans()[-1:]) == SpanExportResult.SUCCESS
        assert _request(client, engine_id)["status"] == "finished_length_capped"


def request_span_id(span) -> str:
    return f"{span.get_span_context().span_id:016x}"
