"""Block and lease state rebuilt from spans, in any arrival order, with gaps reported."""

import time
import uuid

import pytest
from opentelemetry.sdk.trace.export import SpanExportResult

from kvscope.traces import names

from ..story import MS, Process, failure_story, load_story

pytestmark = pytest.mark.timeout(60)


def _engine() -> str:
    return f"engine-{uuid.uuid4().hex[:6]}"


def _get(backend, path: str, **params) -> dict:
    with backend.client() as client:
        response = client.get(path, params=params)
        assert response.status_code == 200, response.text
        return response.json()


def test_blocks_and_leases_after_a_load(backend):
    engine_id = _engine()
    scheduler, worker = Process("s", engine_id, "scheduler"), Process("w", engine_id, "worker")
    load_story(scheduler, worker, None, "req-a", time.time_ns(), lease_id=7, host_ids=(3, 4))
    assert backend.export(scheduler.spans() + worker.spans()) == SpanExportResult.SUCCESS
    blocks = _get(backend, "/api/v1/blocks", engine_id=engine_id)
    state = {(b["tier"], b["block_id"]): b for b in blocks["items"]}
    assert {k: b["state"] for k, b in state.items()} == {
        ("device", 10): "loaded",
        ("device", 11): "loaded",
        ("host", 3): "stored",
        ("host", 4): "stored",
        ("host", 5): "evicted",
    }
    assert state[("host", 3)]["block_hash"] == "aa01"
    assert state[("host", 5)]["block_hash"] == "aa03"  # what was evicted stays visible
    assert not any(b["loading"] for b in blocks["items"])  # the lease was released
    assert blocks["certainty"]["complete"] is True
    [lease] = _get(backend, "/api/v1/leases", engine_id=engine_id)["items"]
    assert lease["lease_id"] == "7" and lease["holder"] == "req-a"
    assert lease["outcome"] == "released" and lease["active"] is False
    assert lease["age_s"] == pytest.approx(0.017, abs=1e-3)


def test_events_arriving_out_of_order_do_not_roll_state_back(backend):
    engine_id = _engine()
    scheduler, worker = Process("s", engine_id, "scheduler"), Process("w", engine_id, "worker")
    load_story(scheduler, worker, None, "req-b", time.time_ns(), lease_id=8)
    spans = scheduler.spans() + worker.spans()
    # Newest first, one span per export: evictions and lease ends land before their causes.
    for span in reversed(spans):
        assert backend.export([span]) == SpanExportResult.SUCCESS
    blocks = _get(backend, "/api/v1/blocks", engine_id=engine_id, tier="host")
    assert {b["block_id"]: b["state"] for b in blocks["items"]} == {
        3: "stored",
        4: "stored",
        5: "evicted",
    }
    [lease] = _get(backend, "/api/v1/leases", engine_id=engine_id)["items"]
    assert lease["outcome"] == "released" and lease["holder"] == "req-b"
    assert lease["acquired_ns"] is not None


def test_an_active_lease_marks_its_blocks_loading(backend):
    engine_id = _engine()
    scheduler = Process("s", engine_id, "scheduler")
    t0 = time.time_ns()
    scheduler.hook(
        "update_connector_output",
        None,
        t0,
        t0 + MS,
        events=[
            (names.EVENT_BLOCK_STORED, t0 + 1, {names.HOST_BLOCK_IDS: [1, 2]}),
            (
                names.EVENT_LEASE_ACQUIRED,
                t0 + 2,
                {
                    names.LEASE_ID: 1,
                    names.LEASE_HOLDER: "r",
                    names.HOST_BLOCK_IDS: [2],
                    names.LEASE_TIMEOUT_S: 60.0,
                },
            ),
        ],
    )
    assert backend.export(scheduler.spans()) == SpanExportResult.SUCCESS
    blocks = _get(backend, "/api/v1/blocks", engine_id=engine_id)["items"]
    assert {b["block_id"]: (b["lease_id"], b["loading"]) for b in blocks} == {
        1: (None, False),
        2: ("1", True),
    }
    [lease] = _get(backend, "/api/v1/leases", engine_id=engine_id, active=True)["items"]
    assert lease["overdue"] is False and lease["expires_ns"] == t0 + 2 + 60 * 10**9


def test_failures_are_listed_with_cause_policy_and_outcome(backend):
    engine_id = _engine()
    scheduler, worker = Process("s", engine_id, "scheduler"), Process("w", engine_id, "worker")
    failure_story(scheduler, worker, "req-f", time.time_ns())
    assert backend.export(scheduler.spans() + worker.spans()) == SpanExportResult.SUCCESS
    failures = _get(backend, "/api/v1/failures", engine_id=engine_id)["items"]
    found = {f["kind"]: (f["cause"], f["policy"], f["outcome"]) for f in failures}
    assert found == {
        "load_failed": ("load_error", "recompute", "recomputed"),
        "lease_expired": ("lease_expired", None, None),
        "transfer_failed": ("peer_dead", None, None),
    }
    [transfer] = _get(backend, "/api/v1/transfers", engine_id=engine_id)["items"]
    assert transfer["ok"] is False and transfer["peer"] == "engine-prefill"
    [lease] = _get(backend, "/api/v1/leases", engine_id=engine_id)["items"]
    assert lease["outcome"] == "expired"


def test_a_seq_hole_is_pending_then_filled(backend):
    engine_id = _engine()
    scheduler, worker = Process("s", engine_id, "scheduler"), Process("w", engine_id, "worker")
    load_story(scheduler, worker, None, "req-g", time.time_ns())
    spans = sorted(scheduler.spans(), key=lambda s: s.attributes[names.SEQ])
    held_back = spans[2:4]
    assert backend.export(spans[:2] + spans[4:]) == SpanExportResult.SUCCESS
    [stream] = [s for s in _get(backend, "/api/v1/streams") if s["origin"] == scheduler.origin]
    [hole] = stream["holes"]
    assert (hole["first"], hole["last"], hole["state"]) == (2, 3, "pending")
    assert stream["status"] == "pending"
    blocks = _get(backend, "/api/v1/blocks", engine_id=engine_id, tier="host")
    assert all(not b["certain"] and "seq 2..3" in b["uncertain_reason"] for b in blocks["items"])
    assert backend.export(held_back) == SpanExportResult.SUCCESS
    [stream] = [s for s in _get(backend, "/api/v1/streams") if s["origin"] == scheduler.origin]
    assert stream["holes"] == [] and stream["status"] == "complete"
    assert stream["received"] == len(spans) and stream["highest_seq"] == len(spans) - 1


def test_a_hole_older_than_the_grace_period_is_missing(make_backend):
    backend = make_backend(gap_grace_s=0.0)
    engine_id = _engine()
    scheduler, worker = Process("s", engine_id, "scheduler"), Process("w", engine_id, "worker")
    load_story(scheduler, worker, None, "req-h", time.time_ns())
    spans = sorted(scheduler.spans(), key=lambda s: s.attributes[names.SEQ])
    assert backend.export(spans[1:]) == SpanExportResult.SUCCESS  # seq 0 never comes
    [stream] = [s for s in _get(backend, "/api/v1/streams") if s["origin"] == scheduler.origin]
    assert stream["status"] == "lossy"
    assert [(h["first"], h["last"], h["state"]) for h in stream["holes"]] == [(0, 0, "missing")]
    [request] = _get(backend, "/api/v1/requests", engine_id=engine_id)["items"]
    timeline = _get(backend, f"/api/v1/requests/{request['id']}/timeline")
    assert timeline["certainty"]["complete"] is False
