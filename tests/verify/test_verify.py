"""kvscope verify on real engines: kvscope's connectors and vLLM's ExampleConnector keep the
contract; planted broken connectors are caught by the rule they break."""

import pytest

from kvscope.verify import rules
from kvscope.verify.connectors import parse_connector
from kvscope.verify.runner import verify

pytestmark = [pytest.mark.engine, pytest.mark.slow]

OFFLOAD_EXTRA = {"cpu_bytes_to_use": 8 << 20, "load_timeout_s": 1.5}
"""512 host blocks; a load not done in 1.5 s fails."""


def _offload_child(name: str) -> dict:
    return {
        "name": name,
        "kv_connector": "CpuOffloadConnector",
        "kv_connector_module_path": "kvscope.connector.cpu_offload.connector",
        "kv_connector_extra_config": dict(OFFLOAD_EXTRA),
    }


def _verdicts(report) -> dict[tuple[str, str], str]:
    return {(r.scenario, r.policy): r.verdict for r in report.results}


def _broken(report) -> list[str]:
    return [
        f"{r.scenario}[{r.policy}] {v.rule}: {v.evidence()}"
        for r in report.results
        for v in r.violations
    ]


def test_cpu_offload_connector_passes(tiny_model):
    report = verify(parse_connector("CpuOffloadConnector", OFFLOAD_EXTRA), tiny_model)
    assert report.passed, _broken(report)
    assert set(_verdicts(report).values()) == {"pass"}, _verdicts(report)  # failed loads ran
    notes = {r.scenario: " ".join(r.notes) for r in report.results}
    assert "0 external hits" not in notes["cold_miss_then_hit"], notes
    assert "0 failed" not in notes["failed_load"], notes


def test_multi_of_two_offloads_passes(tiny_model):
    extra = {"connectors": [_offload_child("a"), _offload_child("b")]}
    report = verify(parse_connector("KvscopeMultiConnector", extra), tiny_model)
    assert report.passed, _broken(report)
    assert set(_verdicts(report).values()) == {"pass"}, _verdicts(report)


def test_p2p_connector_without_a_peer_passes(tiny_model):
    """The P2P connector with no prefill peer (no request names one): it must stay out of the
    way in every scenario. Its pulls need a P/D pair (tests/reliability covers them)."""
    from kvscope.harness.engine import free_port

    report = verify(parse_connector("P2PConnector", {"side_channel_port": free_port()}), tiny_model)
    assert report.passed, _broken(report)
    verdicts = _verdicts(report)
    assert verdicts.pop(("failed_load", "recompute")) == "skip"
    assert verdicts.pop(("failed_load", "fail")) == "skip"
    assert set(verdicts.values()) == {"pass"}, verdicts


def test_example_connector_passes(tiny_model):
    """vLLM's stock ExampleConnector passes every scenario it can run (it has no failure path
    kvscope can drive: failed loads are skipped) but preemption, where verify found a bug of
    its own: a request preempted after a hit resumes with a load of a file named after its
    prompt and generated tokens, which was never stored (FileNotFoundError in start_load_kv,
    build_connector_meta's resumed-request branch in vLLM 0.32)."""
    report = verify(parse_connector("ExampleConnector"), tiny_model)
    verdicts = _verdicts(report)
    assert verdicts.pop(("failed_load", "recompute")) == "skip"
    assert verdicts.pop(("failed_load", "fail")) == "skip"
    assert verdicts.pop(("preemption", "recompute")) == "FAIL"
    assert set(verdicts.values()) == {"pass"}, _broken(report)
    (preemption,) = [r for r in report.results if r.scenario == "preemption"]
    assert [(v.rule, v.span.split()[0]) for v in preemption.violations] == [
        (rules.HOOK_RAISED, "kvscope.hook.start_load_kv")
    ], _broken(report)
    assert "FileNotFoundError" in preemption.violations[0].detail


PLANTED = [
    ("ScrambledLoadConnector", {rules.TOKENS_MATCH}),
    ("NeverReleasingConnector", {rules.BLOCKS_RELEASED, rules.FINISHED_SENDING}),
    # the blocks it claimed but never filled give wrong tokens too
    ("OverClaimingConnector", {rules.CLAIMS_BOUNDED, rules.TOKENS_MATCH}),
]


@pytest.mark.parametrize(("name", "broken_rules"), PLANTED)
def test_planted_connector_is_caught(tiny_model, name, broken_rules):
    """Each planted bug breaks its own rules and no other (run on the catching scenario)."""
    spec = parse_connector(f"tests.verify.planted:{name}")
    report = verify(spec, tiny_model, scenarios=["cold_miss_then_hit"])
    assert not report.passed
    broken = {v.rule for r in report.results for v in r.violations}
    assert broken == broken_rules, _broken(report)
