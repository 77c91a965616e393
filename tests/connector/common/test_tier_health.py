"""The tier-health breaker's state machine on a fake clock, and its kvscope.tier.health spans."""

import pytest

from kvscope.connector.common.tier_health import TierHealth, TierHealthConfig, TierState
from kvscope.traces import names


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def breaker(tier: str = "cpu_offload", **settings) -> tuple[TierHealth, Clock]:
    clock = Clock()
    config = TierHealthConfig(**{"failures_to_bypass": 3, "bypass_s": 2.0, **settings})
    return TierHealth(tier, config, clock), clock


def fail(health: TierHealth, times: int, prefix: str = "r") -> None:
    for i in range(times):
        assert health.admit(f"{prefix}{i}")
        health.record(f"{prefix}{i}", ok=False, reason="timed out after 0.50 s")


def tier_spans(spans, tier: str = "cpu_offload") -> list[dict]:
    """The kvscope.tier.* attributes of each health span of this tier (the pipeline adds its
    seq; spans of earlier tests may still be on their way, hence a tier name per test)."""
    return [
        {k: v for k, v in s.attributes.items() if k.startswith("kvscope.tier")}
        for s in spans()
        if s.name == names.SPAN_TIER_HEALTH and s.attributes[names.TIER] == tier
    ]


def test_failures_in_a_row_bypass_the_tier_and_lookups_answer_no(spans):
    health, _ = breaker("tier-a")
    fail(health, 2)
    assert health.state is TierState.HEALTHY
    fail(health, 1, prefix="x")
    assert health.state is TierState.BYPASSED and health.bypasses == 1
    assert not health.admit("later") and not health.admit("later2")
    assert health.bypassed_lookups == 2
    [span] = tier_spans(spans, "tier-a")
    assert span == {
        names.TIER: "tier-a",
        names.TIER_STATE: "bypassed",
        names.TIER_REASON: "3 loads in a row failed; last: timed out after 0.50 s",
        names.TIER_FAILURES: 3,
        names.TIER_BYPASS_S: 2.0,
    }


def test_the_span_names_the_engine_that_judged_the_tier(spans):
    health = TierHealth("tier-e", TierHealthConfig(failures_to_bypass=1), engine_id="decode-0")
    fail(health, 1)
    [span] = [
        s
        for s in spans()
        if s.name == names.SPAN_TIER_HEALTH and s.attributes[names.TIER] == "tier-e"
    ]
    assert span.attributes[names.ENGINE_ID] == "decode-0"


def test_a_success_resets_the_count_of_failures():
    health, _ = breaker()
    fail(health, 2)
    health.record("ok", ok=True)
    fail(health, 2)
    assert health.state is TierState.HEALTHY and health.failures == 2


def test_one_probe_after_the_bypass_and_its_success_restores_the_tier(spans):
    health, clock = breaker("tier-b")
    fail(health, 3)
    clock.now += 1.9
    assert not health.admit("early")
    clock.now += 0.2
    assert health.admit("probe") and health.state is TierState.PROBING
    assert health.admit("probe"), "the probe's repeated lookup gets the same answer"
    assert not health.admit("other"), "one probe at a time"
    health.record("r0", ok=True)  # a load admitted before the bypass: it changes nothing
    assert health.state is TierState.PROBING
    health.record("probe", ok=True)
    assert health.state is TierState.HEALTHY and health.failures == 0
    assert health.admit("anyone")
    states = [(s[names.TIER_STATE], s[names.TIER_BYPASS_S]) for s in tier_spans(spans, "tier-b")]
    assert states == [("bypassed", 2.0), ("probing", 2.0), ("healthy", 0.0)]


def test_a_failed_probe_doubles_the_bypass_up_to_the_cap():
    health, clock = breaker(max_bypass_s=5.0)
    fail(health, 3)
    bypasses = []
    for i in range(3):
        clock.now += health.bypass_s
        assert health.admit(f"probe{i}")
        health.record(f"probe{i}", ok=False, reason="load failed")
        bypasses.append(health.bypass_s)
        assert health.state is TierState.BYPASSED
    assert bypasses == [4.0, 5.0, 5.0]
    clock.now += 5.0
    assert health.admit("last")
    health.record("last", ok=True)
    assert health.state is TierState.HEALTHY and health.bypass_s == 2.0


def test_outcomes_of_loads_admitted_before_the_bypass_change_nothing():
    health, clock = breaker()
    fail(health, 3)
    health.record("straggler", ok=True)
    health.record("straggler2", ok=False)
    assert health.state is TierState.BYPASSED and health.bypasses == 1
    clock.now += 2.0
    assert health.admit("probe")


def test_a_probe_that_will_not_load_lets_the_next_lookup_probe():
    health, clock = breaker(probe_timeout_s=10.0)
    fail(health, 3)
    clock.now += 2.0
    assert health.admit("miss")
    assert not health.admit("second")
    health.cancel("miss")  # its lookup found nothing to load
    assert health.admit("second") and health.state is TierState.PROBING
    clock.now += 10.0  # the second never reported (e.g. vLLM never allocated it)
    assert health.admit("third")
    health.record("second", ok=True)  # too late: no longer the probe
    assert health.state is TierState.PROBING
    health.record("third", ok=True)
    assert health.state is TierState.HEALTHY


def test_failures_to_bypass_zero_turns_the_breaker_off(spans):
    health, _ = breaker("tier-c", failures_to_bypass=0)
    fail(health, 50)
    assert health.state is TierState.HEALTHY and health.admit("any")
    assert tier_spans(spans, "tier-c") == []


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"failures_to_bypass": -1}, "failures_to_bypass must be an integer >= 0"),
        ({"failures_to_bypass": 2.5}, "failures_to_bypass must be an integer"),
        ({"bypass_s": 0}, "bypass_s must be a positive number of seconds"),
        ({"max_bypass_s": "10"}, "max_bypass_s must be a positive number"),
        ({"bypass_s": 10.0, "max_bypass_s": 5.0}, r"max_bypass_s \(5.0\) must be >= bypass_s"),
        ({"bypass_seconds": 1}, r"unknown tier_health keys \['bypass_seconds'\]"),
    ],
)
def test_bad_settings_are_refused_with_what_to_fix(settings, message):
    with pytest.raises(ValueError, match=message):
        TierHealthConfig.from_extra_config({"tier_health": settings})


def test_settings_come_from_the_connectors_extra_config():
    assert TierHealthConfig.from_extra_config({}) == TierHealthConfig()
    config = TierHealthConfig.from_extra_config({"tier_health": {"failures_to_bypass": 2}})
    assert config.failures_to_bypass == 2 and config.bypass_s == TierHealthConfig.bypass_s
    with pytest.raises(ValueError, match="tier_health must be a dict"):
        TierHealthConfig.from_extra_config({"tier_health": 3})
