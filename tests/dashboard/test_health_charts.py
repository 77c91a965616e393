"""Unit tests of the tier health, clock and block group builders."""

from kvscope.dashboard.charts import blocks, health

S = 10**9
NOW = 1_700_000_000 * S


def _tier(state: str, tier: str = "cpu_offload", engine: str = "e1", **extra) -> dict:
    return {
        "engine_id": engine,
        "tier": tier,
        "state": state,
        "since_ns": NOW - 5 * S,
        "reason": extra.get("reason"),
        "failures": extra.get("failures", 0),
        "bypassed_until_ns": extra.get("until"),
    }


def test_tiers_table_names_engines_and_a_bypassed_tier_stands_out():
    found = [
        _tier("bypassed", reason="timeout", failures=3, until=NOW + S),
        _tier("healthy", "p2p"),
    ]
    table = health.tiers_frame(found, {"e1": "vllm-decode (kv_consumer)"}, NOW)
    assert table.loc[0, "engine"] == "vllm-decode (kv_consumer)"
    assert table.loc[0, "for (s)"] == 5.0 and table.loc[1, "probe at"] == "–"
    styles = health.highlight_bypassed(table).to_html()
    assert health.BYPASSED_STYLE.split(";")[0] in styles
    warning = health.bypassed_warning(found, None)
    assert "cpu_offload on e1" in warning and "p2p" not in warning
    assert health.bypassed_warning([_tier("healthy")], None) is None


def _process(engine: str, offset_ms: float, trusted: bool = True) -> dict:
    return {
        "engine_id": engine,
        "instance_id": f"p-{engine}",
        "service_name": engine,
        "host": None,
        "samples": 50 if trusted else 3,
        "offset_ms": offset_ms,
        "trusted": trusted,
    }


def test_mixed_clocks_are_flagged_only_across_engines_beyond_the_threshold():
    clocks = {
        "threshold_ms": 50.0,
        "processes": [
            _process("prefill", -2.0),
            _process("decode", 1900.0),
            _process("quiet", -4000, False),
        ],
    }
    warning = health.mixed_clocks_warning(clocks, {"prefill", "decode"})
    assert "about 1902 ms" in warning
    assert health.mixed_clocks_warning(clocks, {"prefill"}) is None
    assert health.mixed_clocks_warning(clocks, {"prefill", "quiet"}) is None  # not trusted
    assert list(health.clocks_frame(clocks, None)["trusted"]) == ["yes", "yes", "too few spans"]


def test_block_groups_get_their_own_panels_and_ids_do_not_collide():
    found = [
        {
            "engine_id": "e1",
            "tier": "device",
            "kv_group": group,
            "block_id": 4,
            "address": "id:4" if group == 0 else f"g{group}:id:4",
            "block_hash": None,
            "state": "loaded",
            "lease_id": None,
            "request_id": None,
            "updated_ns": NOW,
            "certain": True,
        }
        for group in (0, 1)
    ]
    frame = blocks.block_frame(found)
    assert list(frame["panel"]) == ["e1 · device · group 0", "e1 · device · group 1"]
    assert blocks.groups_of(frame) == [0, 1]
    one_group = blocks.block_frame([{**found[0], "kv_group": None}])  # an older backend
    assert list(one_group["panel"]) == ["e1 · device"]
