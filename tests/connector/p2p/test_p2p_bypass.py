"""A sick prefill peer on a real P/D pair: after N failed pulls the decode side bypasses it
(computes at once, reads nothing), the tier.health span says so, a later probe restores it,
and greedy tokens equal a run without a connector throughout."""

import time

import pytest

from kvscope.bench.pd.pd_pair import PDPair, free_port, metric
from kvscope.connector.common.tier_health import TierHealthConfig, TierState
from kvscope.connector.p2p.config import P2PConfig
from kvscope.connector.p2p.metadata import P2PWorkerMeta
from kvscope.connector.p2p.scheduler import P2PScheduler
from kvscope.harness.prompts import long_prompt
from kvscope.traces import names
from kvscope.traces.sdk.otlp_json import read_spans_file
from tests.connector.p2p.pd_client import (
    completion_body,
    greedy_via,
    prefill_only,
    wait_until_no_blocks_held,
)
from tests.connector.p2p.test_p2p_protocol import Request, prefilled
from tests.connector.prom_scrape import total, wait_for
from tests.oracle_cache import prompt_set

ENGINE_MARKS = [pytest.mark.engine, pytest.mark.slow, pytest.mark.timeout(500)]

MAX_TOKENS = 8
FAILURES = 2  # failures_to_bypass
BYPASS_S = 6.0  # long enough for the bypassed request to come before the probe
CONNECTOR = {
    "lease_timeout_s": 15.0,
    "lease_margin_s": 1.0,
    "read_timeout_s": 6.0,
    "handshake_timeout_s": 2.0,
    "tier_health": {"failures_to_bypass": FAILURES, "bypass_s": BYPASS_S},
}
# Distinct first blocks: the decode server never has a local prefix hit.
PROMPTS = [f"Bypass case {i}: " + long_prompt(i, sentences=3) for i in range(FAILURES + 2)]
HITS = "vllm:external_prefix_cache_hits_total"
BASELINES = [prompt_set([prompt], MAX_TOKENS) for prompt in PROMPTS]
"""Each prompt alone, as the tests send them: vLLM's CPU kernels are not batch-invariant."""


def engine_test(test):
    for mark in ENGINE_MARKS:
        test = mark(test)
    return test


@pytest.fixture(scope="module")
def expected(oracle):
    return [oracle.tokens(prompts)[0] for prompts in BASELINES]


@pytest.fixture(scope="module")
def pair(tiny_model, tmp_path_factory, expected):
    env = {"OTEL_BSP_SCHEDULE_DELAY": "100"}
    workdir = tmp_path_factory.mktemp("pd_bypass")
    pd = PDPair(tiny_model, workdir, extra=CONNECTOR, env=env, spans_to_files=True).start(400)
    try:
        yield pd
    finally:
        pd.stop()


def decode_spans(pair: PDPair) -> list[dict]:
    time.sleep(0.5)  # the exporter writes every 100 ms
    return read_spans_file(pair.spans_file("decode"))


def reads(spans: list[dict]) -> list[dict]:
    return [
        s
        for s in spans
        if s["name"] == names.SPAN_TRANSFER
        and s["attributes"].get(names.TRANSFER_DIRECTION) == "p2p_read"
    ]


def health_states(spans: list[dict], tier: str) -> list[dict]:
    return [
        s["attributes"]
        for s in spans
        if s["name"] == names.SPAN_TIER_HEALTH and s["attributes"][names.TIER] == tier
    ]


def run(pair: PDPair, tiny_model, index: int, dead_peer: bool = False) -> dict:
    """One request: prefilled on the pair's prefill server, decoded on its decode server; with
    dead_peer the params name a side channel nobody serves (the peer is down)."""
    body = completion_body(tiny_model, PROMPTS[index], MAX_TOKENS)
    params = prefill_only(pair.prefill.url, body)
    if dead_peer:
        params = {**params, "remote_port": free_port()}
    start = time.monotonic()
    tokens = greedy_via(pair.decode.url, {**body, "kv_transfer_params": params})
    return {
        "tokens": tokens,
        "seconds": time.monotonic() - start,
        "tier": f"p2p:{params['remote_engine_id']}",
    }


@pytest.fixture(scope="module")
def sick(pair, tiny_model):
    """FAILURES requests whose peer is down, then one to the live peer: bypassed."""
    failed = [run(pair, tiny_model, i, dead_peer=True)["tokens"] for i in range(FAILURES)]
    before = decode_spans(pair)
    hits_before = metric(pair.decode.url, HITS)
    bypassed = run(pair, tiny_model, FAILURES)
    after = decode_spans(pair)
    return {
        **bypassed,
        "failed": failed,
        "before": before,
        "after": after,
        "hits_before": hits_before,
        "hits_after": metric(pair.decode.url, HITS),
    }


@engine_test
def test_failed_pulls_bypass_the_peer_and_tokens_equal_no_connector(sick, expected):
    assert [*sick["failed"], sick["tokens"]] == expected[: FAILURES + 1]


@engine_test
def test_the_bypassed_request_computes_at_once_and_reads_nothing(sick, pair):
    assert len(reads(sick["after"])) == len(reads(sick["before"])), "a bypassed peer was read"
    assert sick["hits_after"] == sick["hits_before"]
    refusals = [
        e
        for s in sick["after"]
        for e in s["events"]
        if e["name"] == names.EVENT_LOAD_FAILED
        and e[names.FAILURE_CAUSE].startswith("peer bypassed")
    ]
    assert len(refusals) == 1 and refusals[0][names.FAILURE_OUTCOME] == "recomputed"
    assert sick["seconds"] < CONNECTOR["handshake_timeout_s"] + 5  # no timeout waited out
    # The refusal tells the prefill side to free the blocks now, not at its lease's end (the
    # dead peer's requests' leases expire instead).
    assert released_leases(pair, within_s=5.0) == 1


def released_leases(pair: PDPair, within_s: float) -> int:
    """Leases the prefill server ended because the decode side was done (not expired)."""
    deadline = time.monotonic() + within_s
    while True:
        events = [e for s in read_spans_file(pair.spans_file("prefill")) for e in s["events"]]
        count = sum(
            e["name"] == names.EVENT_LEASE_RELEASED and e[names.LEASE_OUTCOME] == "released"
            for e in events
        )
        if count or time.monotonic() > deadline:
            return count
        time.sleep(0.2)


@engine_test
def test_the_tier_health_span_says_the_peer_is_bypassed(sick):
    (state,) = health_states(sick["after"], sick["tier"])
    assert state[names.TIER_STATE] == "bypassed"
    assert state[names.TIER_FAILURES] == FAILURES
    assert state[names.TIER_BYPASS_S] == BYPASS_S
    assert "peer_unreachable" in state[names.TIER_REASON]
    # Named by the decode engine that judged the peer (the tier names the peer).
    assert state[names.ENGINE_ID] and f"p2p:{state[names.ENGINE_ID]}" != sick["tier"]


@engine_test
def test_the_decode_servers_metrics_say_the_peer_is_bypassed(sick, pair):
    """vLLM's /metrics, read with prometheus_client's parser."""
    p2p = "vllm:kvscope_p2p_"
    found = wait_for(pair.decode.url, p2p + "tier_bypasses_total")
    assert total(found, p2p + "tier_bypasses_total") == 1
    assert total(found, p2p + "peers_bypassed") == 1
    assert total(found, p2p + "tier_bypassed_lookups_total") == 1
    assert total(found, p2p + "failed_pulls_total") == FAILURES
    assert (
        total(found, p2p + "failures_total", cause="peer_unreachable", outcome="recomputed")
        == FAILURES
    )


@engine_test
def test_a_probe_after_the_bypass_pulls_again_and_restores_the_peer(
    sick, pair, tiny_model, expected
):
    time.sleep(BYPASS_S)
    hits_before = metric(pair.decode.url, HITS)
    probe = run(pair, tiny_model, FAILURES + 1)
    assert probe["tokens"] == expected[FAILURES + 1]
    assert metric(pair.decode.url, HITS) > hits_before, "the probe did not pull"
    states = [s[names.TIER_STATE] for s in health_states(decode_spans(pair), sick["tier"])]
    assert states == ["bypassed", "probing", "healthy"]
    wait_until_no_blocks_held([pair.prefill.url, pair.decode.url], timeout_s=30)


# --- the scheduler half alone (no engine): outcomes across steps and ranks -------------------


def decode_side(failures_to_bypass: int = 2) -> P2PScheduler:
    config = P2PConfig(tier_health=TierHealthConfig(failures_to_bypass, bypass_s=60.0))
    return P2PScheduler(config, "D", 32)


def pull(decode: P2PScheduler, params: dict, req_id: str) -> tuple[int, bool]:
    request = Request(req_id, 100, dict(params))
    found = decode.lookup(request, 0)
    if found[0]:
        decode.bind(request, ([11, 12, 13, 14],), found[0])
    return found


def test_a_pull_one_rank_failed_counts_once_every_rank_reported():
    """At TP > 1 a rank's failure comes in one step's worker metadata, vLLM's finished_recving
    (counted to the world size) a step later: the failure is kept until then, counted once."""
    _, params = prefilled()
    decode = decode_side()
    for count, req_id in enumerate(("d-1", "d-2")):
        assert pull(decode, params, req_id) == (99, True)
        failed = P2PWorkerMeta(loads_failed={req_id: "read_failed: x"})
        decode.on_worker_output(failed, set(), set())
        decode.on_worker_output(failed, set(), set())  # another rank, another step
        assert decode.health.peers["P"].failures == count
        decode.on_worker_output(None, set(), {req_id})
    assert decode.health.peers["P"].state is TierState.BYPASSED
    decode.build_metadata()
    request = Request("d-3", 100, dict(params))
    assert decode.lookup(request, 0) == (0, False)
    assert request.kv_transfer_params["do_remote_prefill"] is False
    (release,) = decode.build_metadata().reqs_to_release  # the prefill side frees its blocks
    assert release.req_id == "d-3"
    decode.on_worker_output(None, set(), set())
    assert decode.stats["tier_bypasses"] == 1 and decode.stats["tier_bypassed_lookups"] == 1


def test_a_successful_pull_resets_the_count_under_the_default_threshold():
    _, params = prefilled()
    default = TierHealthConfig().failures_to_bypass
    decode = decode_side(default)
    for i in range(default - 1):
        pull(decode, params, f"f-{i}")
        decode.on_worker_output(P2PWorkerMeta(loads_failed={f"f-{i}": "x"}), set(), {f"f-{i}"})
    pull(decode, params, "ok")
    decode.on_worker_output(None, set(), {"ok"})
    health = decode.health.peers["P"]
    assert health.failures == 0 and health.state is TierState.HEALTHY


def test_a_probe_that_will_not_pull_is_given_up():
    _, params = prefilled()
    decode = decode_side(failures_to_bypass=1)
    pull(decode, params, "f")
    decode.on_worker_output(P2PWorkerMeta(loads_failed={"f": "x"}), set(), {"f"})
    decode.health.peers["P"].bypassed_until = 0.0  # the bypass is over
    probe = Request("probe", 100, dict(params))
    assert decode.lookup(probe, 0) == (99, True)
    assert decode.lookup(Request("other", 100, dict(params)), 0) == (0, False)
    decode.bind(probe, ([],), 0)  # all local hits after all: no pull, no outcome
    assert decode.lookup(Request("next", 100, dict(params)), 0) == (99, True)  # the new probe
