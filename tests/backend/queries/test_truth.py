"""What a request, a stream and an engine really did: joined by request id, no false gaps,
engines that stop reporting closed as 'engine lost', one incident per fault."""

import time
import uuid

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from kvscope.demo.replay import RECORDINGS, replay
from kvscope.traces import names
from kvscope.traces.sdk.processors import SequenceProcessor

from ..story import MS, Process, failure_story, load_story

pytestmark = pytest.mark.timeout(120)


def _get(backend, path: str, **params):
    with backend.client() as client:
        response = client.get(path, params=params)
        assert response.status_code == 200, response.text
        return response.json()


def _request_key(backend, request_id: str) -> int:
    [found] = _get(backend, "/api/v1/requests", request_id=request_id)["items"]
    return found["id"]


def test_a_reused_trace_shows_each_request_only_its_own_records(backend):
    engine_id = f"engine-{uuid.uuid4().hex[:6]}"
    scheduler, worker = Process("s", engine_id, "scheduler"), Process("w", engine_id, "worker")
    client = Process("agent", engine_id, "client")
    agent_step = client.start("agent.step", time.time_ns())  # one trace for both requests
    now = time.time_ns()
    load_story(scheduler, worker, None, "reuse-ok", now, lease_id=31, parent=agent_step)
    failure_story(scheduler, worker, "reuse-failed", now + MS, lease_id=32, parent=agent_step)
    agent_step.end()
    backend.export(scheduler.spans() + worker.spans() + client.spans())
    ok = _get(backend, f"/api/v1/requests/{_request_key(backend, 'reuse-ok')}/timeline")
    failed = _get(backend, f"/api/v1/requests/{_request_key(backend, 'reuse-failed')}/timeline")
    assert ok["request"]["trace_id"] == failed["request"]["trace_id"]
    assert ok["failures"] == []
    assert {t["direction"] for t in ok["transfers"]} == {"load"}
    assert {f["request_id"] for f in failed["failures"]} == {"reuse-failed"}
    assert {t["direction"] for t in failed["transfers"]} == {"p2p_read"}
    spans = _get(backend, f"/api/v1/requests/{_request_key(backend, 'reuse-ok')}/spans")
    assert {s["attributes"].get(names.REQUEST_ID) for s in spans} == {"reuse-ok"}


def _numbered_process(origin: str):
    """A tracer numbered by kvscope's own SequenceProcessor, ending spans in memory."""
    provider = TracerProvider(resource=Resource.create({names.PROCESS_ID: origin}))
    memory = InMemorySpanExporter()
    provider.add_span_processor(SequenceProcessor(origin))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    return provider.get_tracer(names.INSTRUMENTATION_NAME), memory


def test_a_request_open_for_minutes_leaves_no_hole_in_its_stream(make_backend):
    backend = make_backend(gap_grace_s=0.0)  # any hole would count as lost at once
    origin = f"proc-{uuid.uuid4().hex[:12]}"
    tracer, memory = _numbered_process(origin)
    attributes = {names.ENGINE_ID: "engine-long", names.REQUEST_ID: "long-1"}
    request = tracer.start_span(names.SPAN_REQUEST, attributes=attributes)
    for _ in range(5):  # the request's hooks end, and are exported, while it stays open
        tracer.start_span(names.SPAN_HOOK_PREFIX + "build_connector_meta").end()
    backend.export(memory.get_finished_spans())
    memory.clear()
    [stream] = [s for s in _get(backend, "/api/v1/streams") if s["origin"] == origin]
    assert stream["holes"] == [] and stream["received"] == 5
    request.end()
    backend.export(memory.get_finished_spans())
    [stream] = [s for s in _get(backend, "/api/v1/streams") if s["origin"] == origin]
    assert stream["holes"] == [] and stream["received"] == 6


def test_spans_started_before_tracing_joined_the_provider_leave_no_hole(make_backend):
    """vLLM starts its own start-up spans ('EngineCoreProc init', 'Allocate KV cache') on the
    provider kvscope later joins: they end numbered in kvscope's stream, so they must carry its
    origin too, or a healthy engine shows holes in one stream and a stray second stream."""
    backend = make_backend(gap_grace_s=0.0)
    origin = f"proc-{uuid.uuid4().hex[:12]}"
    provider = TracerProvider(resource=Resource.create({names.PROCESS_ID: f"vllm-{origin}"}))
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    vllm_tracer = provider.get_tracer("vllm")
    init = vllm_tracer.start_span("EngineCoreProc init")
    allocate = vllm_tracer.start_span("Allocate KV cache")
    provider.add_span_processor(SequenceProcessor(origin))  # kvscope joins vLLM's provider
    ours = provider.get_tracer(names.INSTRUMENTATION_NAME)
    ours.start_span(names.SPAN_HOOK_PREFIX + "register_kv_caches").end()
    allocate.end()
    ours.start_span(names.SPAN_HOOK_PREFIX + "set_xfer_handshake_metadata").end()
    init.end()
    backend.export(memory.get_finished_spans())
    streams = {s["origin"]: s for s in _get(backend, "/api/v1/streams")}
    assert (streams[origin]["received"], streams[origin]["holes"]) == (4, [])
    # The provider's own process id (vLLM's resource) names a stream with nothing numbered in it.
    assert streams[f"vllm-{origin}"]["holes"] == [] and streams[f"vllm-{origin}"]["received"] == 0


def test_an_engine_that_stops_reporting_is_closed_as_engine_lost(make_backend):
    backend = make_backend(engine_lost_after_s=0.3, retention_interval_s=3600.0)
    engine_id = f"engine-{uuid.uuid4().hex[:6]}"
    scheduler = Process("vllm-decode", engine_id, "scheduler")
    now = time.time_ns()
    request = scheduler.start(names.SPAN_REQUEST, now, **{names.REQUEST_ID: "crash-1"})
    lease = {names.LEASE_ID: 5, names.LEASE_HOLDER: "crash-1", names.HOST_BLOCK_IDS: [1]}
    scheduler.hook(
        "get_num_new_matched_tokens",
        request,
        now + MS,
        now + 2 * MS,
        events=[(names.EVENT_LEASE_ACQUIRED, now + 2 * MS, lease)],
        **{names.REQUEST_ID: "crash-1", names.TOKENS_EXTERNAL_HIT: 32},
    )
    scheduler.start(names.SPAN_TELEMETRY, now, **{names.SPANS_EMITTED: 2}).end(now)
    backend.export(scheduler.spans())  # the request span never ends: the engine crashed
    [engine] = [e for e in _get(backend, "/api/v1/stats/engines") if e["engine_id"] == engine_id]
    assert engine["gone"] is False and engine["label"] == "vllm-decode (kv_both)"
    assert _get(backend, "/api/v1/leases", engine_id=engine_id, active=True)["total"] == 1
    time.sleep(0.5)
    backend.app.state.ingest.prune()
    [lease_row] = _get(backend, "/api/v1/leases", engine_id=engine_id)["items"]
    assert lease_row["active"] is False and lease_row["outcome"] == "engine_lost"
    [request_row] = _get(backend, "/api/v1/requests", engine_id=engine_id)["items"]
    assert request_row["status"] == "engine_lost" and request_row["end_ns"] is not None
    [engine] = [e for e in _get(backend, "/api/v1/stats/engines") if e["engine_id"] == engine_id]
    assert engine["gone"] is True


def test_one_failure_story_is_one_incident_with_its_chain(backend):
    engine_id = f"engine-{uuid.uuid4().hex[:6]}"
    scheduler, worker = Process("s", engine_id, "scheduler"), Process("w", engine_id, "worker")
    failure_story(scheduler, worker, "chain-1", time.time_ns(), lease_id=41)
    backend.export(scheduler.spans() + worker.spans())
    assert _get(backend, "/api/v1/failures", engine_id=engine_id)["total"] == 3
    [incident] = _get(backend, "/api/v1/failures/incidents", engine_id=engine_id)["items"]
    assert incident["request_id"] == "chain-1" and incident["reports"] == 3
    assert incident["cause"] == "peer_dead"  # the transfer's cause, not 'load_error'
    assert (incident["policy"], incident["outcome"]) == ("recompute", "recomputed")
    assert [step["kind"] for step in incident["chain"]] == [
        "transfer_failed",
        "load_failed",
        "lease_expired",
    ]


def test_a_fallback_served_by_another_child_is_one_incident(backend):
    engine_id = f"engine-{uuid.uuid4().hex[:6]}"
    worker, scheduler = Process("w", engine_id, "worker"), Process("s", engine_id, "scheduler")
    now = time.time_ns()
    worker.hook(
        "get_finished",
        None,
        now,
        now + MS,
        events=[
            (
                names.EVENT_LOAD_FAILED,
                now + MS,
                {
                    names.REQUEST_ID: "fb-1",
                    names.FAILURE_CAUSE: "InjectedFault: injected",
                    names.BLOCK_IDS: [4, 5],
                    names.CONNECTOR_CHILD: "offload",
                },
            )
        ],
    )
    multi_event = {
        names.REQUEST_ID: "fb-1",
        names.FAILURE_CAUSE: "load_error",
        names.CONNECTOR_CHILD: "offload",
        names.FAILURE_POLICY: "recompute",
        names.FAILURE_OUTCOME: "served_by_fallback",
        names.FALLBACK_CHILD: "p2p",
    }
    scheduler.hook(
        "update_connector_output",
        None,
        now + 2 * MS,
        now + 3 * MS,
        events=[(names.EVENT_LOAD_FAILED, now + 3 * MS, multi_event)],
    )
    backend.export(worker.spans() + scheduler.spans())
    [incident] = _get(backend, "/api/v1/failures/incidents", engine_id=engine_id)["items"]
    assert incident["cause"] == "InjectedFault: injected"
    assert incident["outcome"] == "served_by_fallback" and incident["fallback_child"] == "p2p"
    assert incident["failed_child"] == "offload" and incident["reports"] == 2


def test_the_demo_recordings_failed_loads_are_one_incident_each(make_backend):
    """A failed load is reported by several parts (the copy, the child's load, the Multi,
    vLLM's recompute): the incidents fold every report into the one failed load it belongs to."""
    backend = make_backend()
    replay(RECORDINGS / "demo.jsonl.gz", backend.url, None, 0, now=True)
    reports = _get(backend, "/api/v1/failures", limit=1000)["items"]
    incidents = _get(backend, "/api/v1/failures/incidents", limit=1000)["items"]
    injected = {r["request_id"] for r in reports if "InjectedFault" in (r["cause"] or "")}
    assert injected - {None}, "the demo's fault schedule injected load failures"
    by_request = {incident["request_id"]: incident for incident in incidents}
    assert len(by_request) == len(incidents)  # one incident per failed request
    for request_id in injected - {None}:
        assert by_request[request_id]["cause"].startswith("InjectedFault")
        assert by_request[request_id]["outcome"] == "recomputed"
    assert len(incidents) < len(reports) == sum(incident["reports"] for incident in incidents)
