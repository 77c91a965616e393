"""Silent recomputes over real OTLP exports: requests that ended normally although a load failed
and was recomputed, per engine and cause, with their tokens and ids (SQLite and PostgreSQL)."""

import time
import uuid

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.export import SpanExportResult

from kvscope.backend.queries.recomputes import MAX_REQUEST_IDS
from kvscope.traces import names

from ..story import MS, Process

pytestmark = pytest.mark.timeout(120)

HOUR_MS = 3600 * 1000


def recompute_story(
    scheduler: Process,
    worker: Process,
    req_id: str,
    t0: int,
    cause: str = "InjectedFault: load 1 of the plan failed",
    outcome: str | None = "recomputed",
    policy: str = "recompute",
    status: str = "FINISHED_STOPPED",
    to_load: int = 64,
    block_ids=(10, 11),
    fails: bool = True,
) -> None:
    """A request whose host-pool load fails as the offload connector and vLLM report it: the
    connector's load_failed event on the worker's request span, the failed transfer, vLLM's
    view of the blocks (naming no request); then it ends with `status`."""
    block_ids = list(block_ids)
    request = scheduler.start(
        names.SPAN_REQUEST, t0, None, **{names.REQUEST_ID: req_id, names.PROMPT_TOKENS: 96}
    )
    scheduler.hook(
        "get_num_new_matched_tokens",
        request,
        t0 + MS,
        t0 + 2 * MS,
        **{names.REQUEST_ID: req_id, names.TOKENS_LOCAL_HIT: 0, names.TOKENS_EXTERNAL_HIT: to_load},
    )
    scheduler.hook(
        "update_state_after_alloc",
        request,
        t0 + 3 * MS,
        t0 + 4 * MS,
        **{names.REQUEST_ID: req_id, names.TOKENS_TO_LOAD: to_load, names.BLOCK_IDS: block_ids},
    )
    work = worker.start(
        names.SPAN_WORKER_REQUEST, t0 + 5 * MS, request, **{names.REQUEST_ID: req_id}
    )
    step = worker.start(names.SPAN_STEP, t0 + 5 * MS, None, [trace.Link(work.get_span_context())])
    transfer = worker.start(
        names.SPAN_TRANSFER,
        t0 + 6 * MS,
        work,
        **{
            names.REQUEST_ID: req_id,
            names.TRANSFER_DIRECTION: "load",
            names.TRANSFER_PEER: "host",
            names.TRANSFER_BYTES: 1 << 20,
            names.TRANSFER_OK: not fails,
        },
    )
    transfer.end(end_time=t0 + 7 * MS)
    if fails:
        failure = {
            names.REQUEST_ID: req_id,
            names.FAILURE_CAUSE: cause,
            names.FAILURE_POLICY: policy,
            names.BLOCK_COUNT: len(block_ids),
            names.BLOCK_IDS: block_ids,
        }
        if outcome is not None:
            failure[names.FAILURE_OUTCOME] = outcome
        work.add_event(names.EVENT_LOAD_FAILED, failure, timestamp=t0 + 7 * MS)
        vllm_view = {names.FAILURE_CAUSE: "load_error", names.FAILURE_POLICY: policy}
        if outcome is not None:
            vllm_view[names.FAILURE_OUTCOME] = outcome
        worker.hook(
            "get_block_ids_with_load_errors",
            step,
            t0 + 8 * MS,
            t0 + 8 * MS + 10,
            events=[(names.EVENT_LOAD_FAILED, t0 + 8 * MS, vllm_view)],
            **{names.LOAD_ERROR_BLOCK_IDS: block_ids},
        )
    work.end(end_time=t0 + 9 * MS)
    step.end(end_time=t0 + 9 * MS)
    scheduler.hook(
        "request_finished",
        request,
        t0 + 20 * MS,
        t0 + 21 * MS,
        **{names.REQUEST_ID: req_id, names.BLOCK_IDS: block_ids},
    )
    request.set_attribute(names.REQUEST_STATUS, status)
    request.end(end_time=t0 + 21 * MS)


def engine_pair(service: str = "vllm-engine") -> tuple[Process, Process]:
    engine_id = f"engine-{uuid.uuid4().hex[:8]}"
    return Process(service, engine_id, "scheduler"), Process(service, engine_id, "worker")


def export(backend, *processes: Process) -> None:
    spans = [span for process in processes for span in process.spans()]
    assert backend.export(spans) == SpanExportResult.SUCCESS


def recomputes(backend, window_s: float = 3600.0) -> dict:
    with backend.client() as client:
        answer = client.get("/api/v1/stats/recomputes", params={"window_s": window_s})
    assert answer.status_code == 200, answer.text
    return answer.json()


def rows_of(found: dict, engine_id: str) -> list[dict]:
    return [row for row in found["rows"] if row["engine_id"] == engine_id]


def test_a_request_answered_after_a_recomputed_load_is_counted_with_its_tokens(backend):
    scheduler, worker = engine_pair()
    recompute_story(scheduler, worker, "cmpl-silent-1", time.time_ns() - 60_000 * MS)
    export(backend, scheduler, worker)
    found = recomputes(backend)
    assert found["tokens_basis"] == "tokens_to_load"
    (row,) = rows_of(found, scheduler.engine_id)
    # The connector's report, the failed transfer and vLLM's view are one failure.
    assert (row["cause"], row["requests"], row["load_failures"]) == ("InjectedFault", 1, 1)
    assert row["recomputed_tokens"] == 64 and row["tokens_unknown"] == 0
    (item,) = row["items"]
    assert (item["request_id"], item["recomputed_tokens"]) == ("cmpl-silent-1", 64)
    with backend.client() as client:  # the id opens the request's timeline
        timeline = client.get(f"/api/v1/requests/{item['id']}/timeline").json()
    assert timeline["request"]["request_id"] == "cmpl-silent-1"
    assert timeline["request"]["status"] == "finished_stopped"
    assert "InjectedFault: load 1 of the plan failed" in {f["cause"] for f in timeline["failures"]}


def test_only_normal_answers_after_recomputed_loads_count(backend):
    scheduler, worker = engine_pair()
    t0 = time.time_ns() - 120_000 * MS
    stories = {
        "stopped": {},
        "length-capped": {"status": "FINISHED_LENGTH_CAPPED", "to_load": 32, "block_ids": [4]},
        "policy-implies-recompute": {"outcome": None},  # no report said: the policy decides
        "aborted": {"status": "FINISHED_ABORTED"},
        "errored-under-fail": {"policy": "fail", "outcome": "failed", "status": "FINISHED_ERROR"},
        "served-by-fallback": {"outcome": "served_by_fallback"},
        "clean-load": {"fails": False},
    }
    for index, (name, story) in enumerate(stories.items()):
        recompute_story(scheduler, worker, f"cmpl-{name}", t0 + index * 100 * MS, **story)
    export(backend, scheduler, worker)
    (row,) = rows_of(recomputes(backend), scheduler.engine_id)
    counted = {item["request_id"]: item["recomputed_tokens"] for item in row["items"]}
    assert counted == {
        "cmpl-stopped": 64,
        "cmpl-length-capped": 32,
        "cmpl-policy-implies-recompute": 64,
    }
    assert (row["requests"], row["load_failures"], row["recomputed_tokens"]) == (3, 3, 160)


def test_rows_are_per_engine_and_cause_and_list_the_newest_requests(backend):
    prefill, prefill_worker = engine_pair("vllm-prefill")
    decode, decode_worker = engine_pair("vllm-decode")
    t0 = time.time_ns() - 300_000 * MS
    many = MAX_REQUEST_IDS + 2
    for index in range(many):
        recompute_story(prefill, prefill_worker, f"cmpl-p-{index}", t0 + index * 50 * MS)
    recompute_story(decode, decode_worker, "cmpl-d-timeout", t0, cause="timeout")
    recompute_story(
        decode, decode_worker, "cmpl-d-peer", t0 + MS * 100, cause="peer_dead: no answer in 2 s"
    )
    export(backend, prefill, prefill_worker, decode, decode_worker)
    found = recomputes(backend)
    (row,) = rows_of(found, prefill.engine_id)
    assert (row["requests"], row["recomputed_tokens"]) == (many, 64 * many)
    assert row["truncated"] and len(row["items"]) == MAX_REQUEST_IDS
    assert row["items"][0]["request_id"] == f"cmpl-p-{many - 1}"  # newest first
    by_cause = {r["cause"]: r["requests"] for r in rows_of(found, decode.engine_id)}
    assert by_cause == {"timeout": 1, "peer_dead": 1}


def test_the_window_is_by_when_the_request_ended(backend):
    scheduler, worker = engine_pair()
    recompute_story(scheduler, worker, "cmpl-two-hours-ago", time.time_ns() - 2 * HOUR_MS * MS)
    export(backend, scheduler, worker)
    assert rows_of(recomputes(backend, window_s=3600), scheduler.engine_id) == []
    (row,) = rows_of(recomputes(backend, window_s=3 * 3600), scheduler.engine_id)
    assert row["requests"] == 1


def test_nothing_recomputed_is_an_empty_answer(make_backend):
    backend = make_backend(token="secret")
    with backend.client(token="") as client:
        refused = client.get("/api/v1/stats/recomputes")
    assert refused.status_code == 401
    scheduler, worker = engine_pair()
    recompute_story(scheduler, worker, "cmpl-clean", time.time_ns() - 1000 * MS, fails=False)
    export(backend, scheduler, worker)
    found = recomputes(backend)
    assert (found["requests"], found["recomputed_tokens"], found["rows"]) == (0, 0, [])
