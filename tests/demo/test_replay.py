"""`kvscope replay`: the recorded demo run goes into a backend, ready for the dashboard."""

import json
import os
import subprocess
import sys
import time
import urllib.request

from kvscope.demo.replay import RECORDINGS, recorded_lines


def test_the_recording_is_small_and_real():
    path = RECORDINGS / "demo.jsonl.gz"
    assert path.stat().st_size < 1_000_000
    text = b"\n".join(recorded_lines(path))
    for name in (b"kvscope.request", b"kvscope.transfer", b"p2p_read", b"CpuOffloadCore"):
        assert name in text


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
