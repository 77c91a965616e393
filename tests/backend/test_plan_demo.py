"""GET /api/v1/plan and `kvscope plan` on the shipped demo recording, replayed into a backend."""

import gzip
import json
from contextlib import contextmanager

import pytest

from kvscope.cli.main import main as kvscope
from kvscope.demo.replay import RECORDINGS, recorded_lines, replay
from kvscope.traces import names


@contextmanager
def _backend_with(path, tmp_path_factory, name):
    """A backend given the recording at path, its times moved to now."""
    from kvscope.backend.settings import Settings
    from tests.backend.conftest import RunningBackend

    url = f"sqlite:///{tmp_path_factory.mktemp(name) / 'kvscope.db'}"
    with RunningBackend(Settings(database_url=url, ingest_workers=0)) as backend:
        replay(path, backend.url, None, 0, now=True)
        yield backend


@pytest.fixture(scope="module")
def demo_backend(tmp_path_factory):
    with _backend_with(RECORDINGS / "demo.jsonl.gz", tmp_path_factory, "plan-demo") as backend:
        yield backend


@pytest.fixture(scope="module")
def unasked_backend(tmp_path_factory):
    """The recording without its kvscope.block.looked_up events, as spans from before
    lookups recorded what they asked."""
    path = tmp_path_factory.mktemp("unasked") / "demo.jsonl.gz"
    with gzip.open(path, "wb") as out:
        for line in recorded_lines(RECORDINGS / "demo.jsonl.gz"):
            batch = json.loads(line)
            for rs in batch["resourceSpans"]:
                for ss in rs.get("scopeSpans", ()):
                    for span in ss.get("spans", ()):
                        span["events"] = [
                            event
                            for event in span.get("events", ())
                            if event["name"] != names.EVENT_BLOCK_LOOKED_UP
                        ]
            out.write(json.dumps(batch).encode() + b"\n")
    with _backend_with(path, tmp_path_factory, "plan-unasked") as backend:
        yield backend


def test_todays_pool_replayed_gives_the_demos_measured_hit_tokens(demo_backend):
    """Both demo engines' pools are replayed; at today's size under the pool's own LRU the
    replay answers the hit tokens the connector answered, within 2%."""
    with demo_backend.client() as client:
        report = client.get("/api/v1/plan", params={"window": 10**6}).json()
    assert report["not_replayable"] == []
    assert len(report["engines"]) == 2  # the prefill and the decode engine
    for engine in report["engines"]:
        measured = engine["measured_hit_tokens"]
        today = next(r for r in engine["rows"] if r["policy"] == "lru" and r["factor"] == 1.0)
        assert measured > 0 and abs(today["hit_tokens"] - measured) <= 0.02 * measured
        assert engine["load_tokens_per_s"] and engine["prefill_tokens_per_s"]
        assert {r["policy"] for r in engine["rows"]} == {"lru", "2q", "s3fifo"}


def test_each_engine_has_a_ceiling_and_a_knee_per_policy_within_one_percent_of_it(demo_backend):
    """The demo's pools are far larger than its traffic: the ceiling is what today's pool
    hits, and each knee is a small fraction of today's size."""
    with demo_backend.client() as client:
        report = client.get("/api/v1/plan", params={"window": 10**6}).json()
    assert report["knee_share"] == 0.99
    for engine in report["engines"]:
        ceiling, today = engine["ceiling"], _row(engine, "lru", 1.0)
        assert ceiling["hit_tokens"] == today["hit_tokens"] > 0
        assert ceiling["pool_blocks"] < engine["pool_blocks"]
        assert [k["policy"] for k in engine["knees"]] == ["lru", "2q", "s3fifo"]
        for knee in engine["knees"]:
            assert knee["hit_tokens"] >= 0.99 * ceiling["hit_tokens"]
            assert knee["pool_blocks"] <= ceiling["pool_blocks"] and knee["factor"] < 1
        assert 1 <= engine["size_step_blocks"] <= max(1, ceiling["pool_blocks"] // 128)
        # The demo recording has no llm_request spans: no TTFT is invented.
        assert engine["priced_requests"] == 0 and today["predicted_ttft_ms_p50"] is None


def _row(engine: dict, policy: str, factor: float) -> dict:
    return next(r for r in engine["rows"] if r["policy"] == policy and r["factor"] == factor)


def test_lookups_that_did_not_say_what_they_asked_are_named_not_replayable(unasked_backend):
    """No invented numbers: each engine whose pool stored blocks is named instead."""
    with unasked_backend.client() as client:
        report = client.get("/api/v1/plan", params={"window": 10**6}).json()
    assert report["engines"] == []
    assert len(report["not_replayable"]) == 2


def test_bad_sizes_are_refused_with_what_to_send(demo_backend):
    with demo_backend.client() as client:
        answer = client.get("/api/v1/plan", params={"sizes": "half"})
    assert answer.status_code == 422 and "comma" in answer.json()["detail"]


def test_the_cli_prints_each_engines_table(demo_backend, capsys):
    assert kvscope(["plan", "--backend", demo_backend.url, "--window", "1000000"]) == 0
    out = capsys.readouterr().out
    assert out.count("hit today") == 2 and out.count("  2q ") == 12
    assert out.count("  s3fifo ") == 12 and out.count("ceiling (a pool that never evicts)") == 2
    assert out.count("knee ") == 6 and "size step" in out


def test_the_cli_says_why_there_is_nothing_to_replay(unasked_backend, capsys):
    assert kvscope(["plan", "--backend", unasked_backend.url, "--window", "1000000"]) == 1
    out = capsys.readouterr().out
    assert out.count("did not record the blocks they asked") == 2
