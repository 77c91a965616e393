"""Miss reasons and tier alarms on the shipped demo recording (real engines' spans), replayed
into a backend: per request and per engine they add up to the missed tokens, agree with the
token accounting, and /metrics counts the same tokens by reason (read with prometheus_client)."""

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvscope.backend.queries.misses.vocabulary import REASONS
from kvscope.demo.replay import RECORDINGS, replay

WINDOW = {"window_s": 10**6}


@pytest.fixture(scope="module")
def demo_backend(tmp_path_factory):
    from kvscope.backend.settings import Settings
    from tests.backend.conftest import RunningBackend

    url = f"sqlite:///{tmp_path_factory.mktemp('misses-demo') / 'kvscope.db'}"
    settings = Settings(database_url=url, ingest_workers=0, miss_metrics_settle_s=0)
    with RunningBackend(settings) as backend:
        replay(RECORDINGS / "demo.jsonl.gz", backend.url, None, 0, now=True)
        yield backend


@pytest.fixture(scope="module")
def found(demo_backend):
    with demo_backend.client() as client:
        misses = client.get("/api/v1/stats/misses", params=WINDOW).json()
        accounting = client.get("/api/v1/stats/accounting", params=WINDOW).json()
        metrics = client.get("/metrics").text
    return misses, accounting, metrics


def test_each_requests_reasons_add_up_to_its_missed_tokens(found):
    misses, _, _ = found
    assert misses["requests"] and not misses["violations"]
    for request in misses["requests"]:
        assert set(r["reason"] for r in request["reasons"]) <= set(REASONS)
        assert sum(r["tokens"] for r in request["reasons"]) == request["missed_tokens"]
        assert request["missed_tokens"] == request["prompt_tokens"] - request["served_tokens"]


def test_engines_reasons_are_shares_of_the_missed_tokens_and_agree_with_accounting(found):
    misses, accounting, _ = found
    accounted = {e["engine_id"]: e for e in accounting["engines"]}
    assert len(misses["engines"]) == 2  # the demo's prefill and decode engines
    for engine in misses["engines"]:
        assert engine["violations"] == 0
        assert sum(engine["tokens_by_reason"].values()) == engine["missed_tokens"]
        assert sum(engine["share_by_reason"].values()) == pytest.approx(1.0)
        account = accounted[engine["engine_id"]]
        assert engine["requests"] == account["requests"]
        assert engine["prompt_tokens"] == account["prompt_tokens"]
        assert (
            engine["tokens_by_reason"].get("local_prefix_cache", 0) == account["local_hit_tokens"]
        )
        served = sum(account["external_hit_tokens"].values())
        failed = engine["tokens_by_reason"].get("load_failed", 0)
        assert engine["missed_tokens"] == account["prompt_tokens"] - served + failed
        # The demo's prompts share prefixes and differ after them: blocks explained one by one.
        assert engine["tokens_by_reason"].get("prefix_diverged", 0) > 0


def test_one_requests_answer_is_its_entry_in_the_window(demo_backend, found):
    misses, _, _ = found
    request = next(r for r in misses["requests"] if len(r["reasons"]) > 2)
    with demo_backend.client() as client:
        one = client.get(f"/api/v1/requests/{request['id']}/misses").json()
        missing = client.get("/api/v1/requests/999999999/misses")
    assert one == request
    assert missing.status_code == 404 and "list them" in missing.json()["detail"]


def test_metrics_count_the_missed_tokens_by_reason(found):
    misses, _, metrics = found
    families = {f.name: f for f in text_string_to_metric_families(metrics)}
    counted: dict[str, dict[str, float]] = {}
    for sample in families["kvscope_backend_missed_tokens"].samples:
        engine = counted.setdefault(sample.labels["engine_id"], {})
        engine[sample.labels["reason"]] = sample.value
    for engine in misses["engines"]:
        assert counted[engine["engine_id"]] == pytest.approx(engine["tokens_by_reason"])
    stored = {
        s.labels["engine_id"]: s.value
        for s in families["kvscope_backend_tier_stored_blocks"].samples
    }
    assert all(value > 0 for value in stored.values()) and len(stored) == 2


def test_a_healthy_demo_pool_raises_no_tier_alarm(demo_backend):
    with demo_backend.client() as client:
        alarms = client.get("/api/v1/stats/tier-alarms", params=WINDOW).json()
    assert len(alarms["tiers"]) == 2
    for tier in alarms["tiers"]:
        assert tier["stored_blocks"] > 0 and tier["hit_blocks"] > 0
        assert not tier["written_never_read"] and not tier["dropped_alarm"]
        assert tier["alarms"] == []
        assert tier["stored_bytes"] > 0
