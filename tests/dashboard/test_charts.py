"""Chart and table builders: pure functions from API documents to frames and Altair specs."""

import json

import pandas as pd

from kvscope.dashboard.charts import blocks, overview, tables, timeline
from kvscope.dashboard.charts.format import human_bytes, short_cause
from kvscope.dashboard.settings import jaeger_trace_url
from kvscope.traces import names

NOW = 1_800_000_000_000_000_000
S = 1_000_000_000


def test_paths_always_list_the_three_paths_with_throughput_over_the_window():
    summary = {"window_s": 10.0, "transfers": {"load": {"count": 2, "bytes": 50e6, "failed": 1}}}
    frame = overview.paths_frame(summary).set_index("path")
    assert list(frame.index) == ["device→host store", "host→device load", "prefill→decode read"]
    assert frame.loc["host→device load", "MB/s over window"] == 5.0
    assert frame.loc["host→device load", "failed"] == 1
    assert frame.loc["prefill→decode read", "transfers"] == 0


def test_hit_rates_by_request_and_by_token_per_connector_and_child():
    hits = [
        {
            "connector": "MultiConnector",
            "child": "CpuOffload",
            "requests": 4,
            "hit_requests": 1,
            "external_hit_tokens": 32,
            "prompt_tokens": 128,
        },
        {
            "connector": "MultiConnector",
            "child": None,
            "requests": 0,
            "hit_requests": 0,
            "external_hit_tokens": 0,
            "prompt_tokens": 0,
        },
    ]
    frame = overview.hit_rate_frame(hits)
    assert frame.loc[0, "requests hit %"] == 25.0 and frame.loc[0, "tokens hit %"] == 25.0
    assert frame.loc[1, "child"] == "–" and pd.isna(frame.loc[1, "tokens hit %"])


def test_stream_warnings_name_dropped_missing_and_pending_spans():
    hole = {"count": 5, "state": "missing"}
    streams = [
        {"origin": "aaaaaaaaaaaa", "service_name": "w", "telemetry_dropped": 7, "holes": [hole]},
        {
            "origin": "bbbbbbbbbbbb",
            "service_name": "s",
            "telemetry_dropped": 0,
            "holes": [{"count": 2, "state": "pending"}],
        },
        {"origin": "cccccccccccc", "service_name": "ok", "telemetry_dropped": None, "holes": []},
    ]
    warnings = overview.stream_warnings(streams)
    assert len(warnings) == 3
    assert "dropped 7" in warnings[0] and "5 spans never arrived" in warnings[1]
    assert "2 spans not yet received" in warnings[2]


def _block(block_id, state="stored", tier="host", lease_id=None, updated_ns=NOW, engine="e1"):
    return {
        "engine_id": engine,
        "tier": tier,
        "block_id": block_id,
        "address": f"id:{block_id}",
        "block_hash": None,
        "state": state,
        "lease_id": lease_id,
        "request_id": None,
        "updated_ns": updated_ns,
        "certain": True,
    }


def test_block_states_leased_and_failed_override_what_the_backend_stored():
    found = [
        _block(1, lease_id="7"),
        _block(2, "loaded", tier="device", updated_ns=NOW),
        _block(3, "loaded", tier="device", updated_ns=NOW + 5 * S),
    ]
    failure = {"engine_id": "e1", "time_ns": NOW + S, "block_ids": "[2, 3, 9]", "request_id": "r"}
    frame = blocks.block_frame(found, [failure]).set_index(["tier", "block_id"])
    assert frame.loc[("host", 1), "state"] == "leased/loading"
    assert frame.loc[("device", 2), "state"] == "failed"  # failed after it was loaded
    assert frame.loc[("device", 3), "state"] == "loaded"  # loaded again after the failure
    assert frame.loc[("device", 9), "state"] == "failed"  # never arrived at all


def test_block_map_keeps_cells_at_block_ids_and_draws_thousands():
    found = [_block(i, "evicted" if i % 10 == 0 else "stored") for i in range(5000)]
    found.append({**_block(None), "address": "hash:ab"})
    frame = blocks.block_frame(found)
    assert frame.loc[frame["block_id"] == 130, ["col", "row"]].values.tolist() == [[2, 2]]
    assert frame.loc[frame["address"] == "hash:ab", "cell"].item() == 5000  # after the ids
    spec = blocks.block_map(frame).to_dict()
    assert len(spec["data"]["values"]) == 5001  # past Altair's 5000-row limit for frames
    assert spec["height"] == (5000 // blocks.COLUMNS + 1) * blocks.CELL_PX
    counts = blocks.state_counts(frame).set_index("panel").loc["e1 · host"]
    assert counts["evicted"] == 500 and counts["stored"] == 4501


def _span(span_id, name, start, end, parent=None, **attributes):
    return {
        "span_id": span_id,
        "parent_span_id": parent,
        "name": name,
        "start_ns": start,
        "end_ns": end,
        "status_code": 0,
        "engine_id": None,
        "service_name": "svc",
        "attributes": attributes,
    }


def test_gantt_lanes_follow_engine_role_and_transfers_inherit_their_parent():
    decode = {names.KV_ROLE: "kv_consumer", names.ENGINE_ID: "d", names.CONNECTOR_ROLE: "worker"}
    spans = [
        _span(
            "r",
            names.SPAN_REQUEST,
            NOW,
            NOW + 400 * 10**6,
            **{
                names.KV_ROLE: "kv_producer",
                names.CONNECTOR_ROLE: "scheduler",
                names.ENGINE_ID: "p",
            },
        ),
        _span(
            "h",
            names.SPAN_HOOK_PREFIX + "start_load_kv",
            NOW + 1000,
            NOW + 21000,
            "r",
            **{names.KV_ROLE: "kv_producer", names.CONNECTOR_ROLE: "scheduler"},
        ),
        _span("w", names.SPAN_WORKER_REQUEST, NOW + 10**6, NOW + 2 * 10**6, "r", **decode),
        _span(
            "t",
            names.SPAN_TRANSFER,
            NOW + 10**6,
            NOW + 10**6 + 10,
            "w",
            **{names.TRANSFER_OK: False},
        ),
    ]
    bars = timeline.gantt_frame(spans, NOW).set_index("span")
    assert bars.loc["request", "lane"] == "prefill · request"
    assert bars.loc["start_load_kv", "lane"] == "prefill · scheduler"
    assert bars.loc["worker.request", "lane"] == "decode · worker"
    assert bars.loc["transfer", "lane"] == "decode · transfer"
    assert bars.loc["transfer", "kind"] == "failed transfer"
    # A 10 ns transfer still gets a visible bar; its true duration stays in the tooltip.
    assert bars.loc["transfer", "shown_end_ms"] - bars.loc["transfer", "start_ms"] >= 1.6
    assert bars.loc["transfer", "duration_ms"] == 0.0
    points = timeline.points_frame(
        {
            "points": [
                {"point": "layer_ready", "time_ns": NOW + 3 * 10**6, "value": None, "layer": 1}
            ]
        },
        NOW,
    )
    assert points.loc[0, "point"] == "layer_ready L1" and points.loc[0, "at_ms"] == 3.0
    spec = timeline.gantt_chart(bars.reset_index(), points).to_dict()
    assert spec["layer"][1]["encoding"]["y"]["sort"][0] == "prefill · request"


def test_ttft_parts_keep_their_sources_and_skip_unknown_parts():
    sources = {"queue_ms": "gen_ai.latency.time_in_queue"}
    ttft = {
        "ttft_ms": 40.0,
        "queue_ms": 0.5,
        "lookup_ms": 1.0,
        "kv_wait_ms": None,
        "compute_ms": 38.5,
        "sources": sources,
    }
    parts = timeline.ttft_frame(ttft)
    assert list(parts["part"]) == ["queue", "lookup", "compute"]
    assert parts["ms"].sum() == 40.0
    assert parts.loc[0, "from"] == "gen_ai.latency.time_in_queue"


def _lease(lease_id, active=True, overdue=False, outcome=None, acquired=NOW - 5 * S):
    return {
        "lease_id": lease_id,
        "engine_id": "e1",
        "holder": "req-1",
        "host_block_ids": "[1, 2]",
        "acquired_ns": acquired,
        "active": active,
        "overdue": overdue,
        "outcome": outcome,
        "age_s": 1.0,
        "expires_ns": acquired + 2 * S,
        "certain": True,
    }


def test_leases_table_counts_age_and_expiry_from_now_and_highlights_expired():
    found = [
        _lease("a", overdue=True),
        _lease("b", active=False, outcome="expired"),
        _lease("c", active=False, outcome="released"),
    ]
    table = tables.leases_table(found, NOW)
    assert list(table["state"]) == ["overdue", "expired", "released"]
    assert table.loc[0, "age s"] == 5.0 and table.loc[0, "expires in s"] == -3.0
    assert table.loc[0, "host blocks"] == 2
    styles = tables.highlight_expired(table)._compute().ctx
    assert styles[(0, 0)] and styles[(1, 0)] and not styles.get((2, 0))


def test_failures_table_says_cause_policy_outcome_and_request():
    failure = {
        "time_ns": NOW,
        "kind": "load_failed",
        "cause": "InjectedFault: injected",
        "policy": "recompute",
        "outcome": None,
        "request_id": "r-1",
        "engine_id": "e1",
        "lease_id": None,
        "block_ids": json.dumps([3, 4]),
    }
    row = tables.failures_table([failure]).iloc[0]
    assert (row["cause"], row["policy"], row["outcome"]) == ("InjectedFault", "recompute", "–")
    assert row["request"] == "r-1" and row["blocks"] == "3, 4"


def test_small_helpers():
    assert human_bytes(1536) == "1.5 KiB" and human_bytes(None) == "–"
    assert short_cause("timeout") == "timeout" and short_cause(None) == "unknown"
    assert jaeger_trace_url(None, "abc") is None
    assert jaeger_trace_url("http://j:16686/", "abc") == "http://j:16686/trace/abc"
