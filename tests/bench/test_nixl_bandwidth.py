"""bench.nixl_bandwidth on a tiny cache: every arm reads real blocks over NIXL, and the report
gets each ratio with its interval."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("nixl")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def test_every_arm_reads_and_each_ratio_is_recorded_with_its_interval(tmp_path):
    results = tmp_path / "results.jsonl"
    command = [sys.executable, "-m", "kvscope.bench.transfer.nixl_bandwidth", "--layers", "2"]
    command += ["--blocks", "16", "--read-blocks", "4", "--rounds", "2", "--trials", "1"]
    command += ["--idle-s", "0.2"]
    env = {**os.environ, "KVSCOPE_BENCH_RESULTS": str(results)}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    figures = {row["metric"]: row for row in map(json.loads, results.read_text().splitlines())}
    for metric in (
        "read_over_raw_progress_thread",
        "read_over_raw_poll_1ms",
        "read_kvscope_reader_over_raw_reader",
        "read_kvscope_owner_over_raw_owner",
    ):
        assert figures[metric]["value"] > 0, figures[metric]
        assert "90% bootstrap interval" in figures[metric]["note"], figures[metric]
    assert "median of 2 rounds each" in done.stdout, done.stdout[-3000:]
