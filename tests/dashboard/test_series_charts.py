"""Series, lease-age and incident builders: the backend's documents to frames and charts."""

from kvscope.dashboard.charts import leases, overview, series, tables
from kvscope.dashboard.charts.format import engine_name

NOW = 1_800_000_000_000_000_000
S = 1_000_000_000

SERIES = {
    "since_ns": NOW - 60 * S,
    "until_ns": NOW,
    "step_s": 10.0,
    "hits": [
        {
            "time_ns": NOW - 60 * S,
            "lookups": 2,
            "hit_requests": 1,
            "hit_tokens": 32,
            "prompt_tokens": 128,
            "hit_rate": 0.25,
        },
        {
            "time_ns": NOW - 50 * S,
            "lookups": 1,
            "hit_requests": 0,
            "hit_tokens": 0,
            "prompt_tokens": 0,
            "hit_rate": None,
        },
    ],
    "bytes": [
        {"time_ns": NOW - 60 * S, "direction": "load", "bytes": 20_000_000, "bytes_per_s": 2e6}
    ],
    "leases": [{"time_ns": NOW - 60 * S, "held": 1}, {"time_ns": NOW - 50 * S, "held": 0}],
    "failures": [{"time_ns": NOW - 50 * S, "cause": "InjectedFault", "incidents": 2}],
    "ttft": [
        {
            "time_ns": NOW - 60 * S,
            "requests": 3,
            "ttft_p50_ms": 40.0,
            "ttft_p95_ms": 90.0,
            "kv_waits": 2,
            "kv_wait_p50_ms": 5.0,
            "kv_wait_p95_ms": None,
        }
    ],
}


def test_series_frames_carry_the_backends_numbers_in_reader_units():
    assert list(series.hit_rate_frame(SERIES)["hit rate %"]) == [25.0]  # no prompt: no rate
    moved = series.bytes_frame(SERIES)
    assert list(moved["path"]) == ["host→device load"] and list(moved["MB/s"]) == [2.0]
    assert list(series.leases_frame(SERIES)["held"]) == [1, 0]
    assert list(series.failures_frame(SERIES)["incidents"]) == [2]
    ttft = series.ttft_frame(SERIES).set_index("measure")["ms"].to_dict()
    assert ttft == {"TTFT p50": 40.0, "TTFT p95": 90.0, "KV wait p50": 5.0}


def test_every_series_with_data_has_a_chart_and_an_empty_one_says_so():
    found = series.charts(SERIES)
    assert list(found) == [
        "External hit rate",
        "Bytes/s per path",
        "Leases held",
        "TTFT and its KV wait",
        "Failure incidents per cause",
    ]
    assert found["TTFT and its KV wait"].to_dict()["encoding"]["color"]["field"] == "measure"
    assert found["Failure incidents per cause"].to_dict()["mark"]["type"] == "bar"
    empty = series.charts({"hits": [], "bytes": [], "leases": [], "failures": [], "ttft": []})
    assert set(empty.values()) == {None}


def test_lease_ages_against_their_timeout_oldest_first():
    held = [
        {
            "lease_id": "1",
            "holder": "r-old",
            "acquired_ns": NOW - 40 * S,
            "timeout_s": 30.0,
            "overdue": True,
        },
        {
            "lease_id": "2",
            "holder": "r-new",
            "acquired_ns": NOW - 2 * S,
            "timeout_s": 30.0,
            "overdue": False,
        },
    ]
    frame = leases.lease_age_frame(held, NOW)
    assert list(frame["age s"]) == [40.0, 2.0] and list(frame["state"]) == ["overdue", "held"]
    layers = leases.lease_age_chart(frame).to_dict()["layer"]
    assert [layer["mark"]["type"] for layer in layers] == ["bar", "tick"]


def test_an_incident_reads_as_its_chain_with_the_fallback_child():
    incident = {
        "time_ns": NOW,
        "kind": "load_failed",
        "cause": "InjectedFault: injected: load 3",
        "policy": "recompute",
        "outcome": "served_by_fallback",
        "outcome_inferred": False,
        "failed_child": "offload",
        "fallback_child": "p2p",
        "request_id": "r-1",
        "engine_id": "e1",
        "reports": 3,
        "block_ids": [4, 5],
        "chain": [{"kind": "transfer_failed", "cause": "InjectedFault"}],
    }
    assert tables.chain_text(incident) == (
        "InjectedFault in offload → recompute → served_by_fallback by p2p"
    )
    row = tables.incidents_table([incident], {"e1": "vllm-decode (kv_consumer)"}).iloc[0]
    assert row["engine"] == "vllm-decode (kv_consumer)" and row["reports"] == 3
    unknown = {**incident, "outcome": None, "fallback_child": None, "failed_child": None}
    assert tables.chain_text(unknown).endswith("→ recompute → outcome not reported")


def test_engines_are_named_by_service_and_role():
    engines = [
        {
            "engine_id": "6e77ba98-af00",
            "label": "vllm-prefill (kv_producer)",
            "service_name": "vllm-prefill",
            "kv_role": "kv_producer",
            "processes": 2,
            "last_seen_ns": NOW,
            "gone": True,
            "instance_ids": ["p1"],
        },
    ]
    row = overview.engines_frame(engines).iloc[0]
    assert row["engine"] == "vllm-prefill (kv_producer)" and row["state"] == "gone (engine lost)"
    assert engine_name("6e77ba98-af00", {"6e77ba98-af00": "vllm-prefill"}) == "vllm-prefill"
    assert engine_name("6e77ba98-af00-4ab7") == "6e77ba98"  # unknown: the short id
