"""`kvscope replay`: the recorded demo run goes into a backend, ready for the dashboard."""

import json
import os
import subprocess
import sys
import time
import urllib.request

from kvscope.demo.replay import RECORDINGS, recorded_lines
from kvscope.traces import names


def test_the_recording_is_small_and_real():
    path = RECORDINGS / "demo.jsonl.gz"
    assert path.stat().st_size < 1_000_000
    text = b"\n".join(recorded_lines(path))
    for name in (b"kvscope.request", b"kvscope.transfer", b"p2p_read", b"CpuOffloadCore"):
        assert name in text


def test_the_recording_speaks_todays_span_schema():
    """A replayed recording feeds the pages as a live run does: it carries the span schema's
    current version and the block and lease events today's connectors emit (a recording from
    before kvscope.block.loaded existed showed 0 loaded blocks beside a series of loads)."""
    batches = [json.loads(line) for line in recorded_lines(RECORDINGS / "demo.jsonl.gz")]
    resources = [rs.get("resource", {}) for batch in batches for rs in batch["resourceSpans"]]
    versions = {
        attribute["value"].get("intValue", attribute["value"].get("stringValue"))
        for resource in resources
        for attribute in resource.get("attributes", ())
        if attribute["key"] == names.SCHEMA
    }
    assert {int(version) for version in versions} == {names.SCHEMA_VERSION}
    events = {
        event["name"]
        for batch in batches
        for rs in batch["resourceSpans"]
        for ss in rs.get("scopeSpans", ())
        for span in ss.get("spans", ())
        for event in span.get("events", ())
    }
    emitted = {
        names.EVENT_BLOCK_STORED,
        names.EVENT_BLOCK_LOADED,
        names.EVENT_LEASE_ACQUIRED,
        names.EVENT_LEASE_RELEASED,
        names.EVENT_LOAD_FAILED,
        names.EVENT_BLOCK_LOOKED_UP,  # what-if sizing replays these
    }
    assert emitted <= events, f"the recording lacks {sorted(emitted - events)}: re-record it"


def test_replay_fills_a_backend_with_times_moved_to_now(tmp_path):
    env = {**os.environ, "DATABASE_URL": f"sqlite:///{tmp_path / 'kvscope.db'}"}
    backend = subprocess.Popen(
        [sys.executable, "-m", "kvscope.cli.main", "backend", "--port", "14329"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    url = "http://127.0.0.1:14329"
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(url + "/health", timeout=2)
                break
            except OSError:
                time.sleep(0.2)
        result = subprocess.run(
            [sys.executable, "-m", "kvscope.cli.main", "replay", "--backend", url],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert result.returncode == 0, result.stderr[-2000:]
        with urllib.request.urlopen(url + "/api/v1/stats/summary?window_s=600") as response:
            summary = json.loads(response.read())
        assert sum(summary["requests"].values()) > 20
        assert summary["transfers"].get("p2p_read") and summary["external_hit_tokens"] > 0
    finally:
        backend.terminate()
        backend.wait(20)
