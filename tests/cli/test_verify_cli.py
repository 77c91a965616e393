"""`kvscope verify`: exit status, a table or JSON on stdout, progress on stderr, bad input."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def run_verify(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kvscope.cli.main", "verify", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},  # the planted connectors: tests.verify
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--connector", "NoSuchConnector"], "is not a vLLM built-in"),
        (["--connector", ":Nothing"], "give a class name or module.path:ClassName"),
        (["--connector", "ExampleConnector", "--config", "{not json"], "Expecting property"),
        (["--connector", "ExampleConnector", "--config", "[1]"], "must be a JSON object"),
        (["--connector", "ExampleConnector", "--scenario", "nope"], "unknown scenarios"),
        (["--connector", "ExampleConnector", "--model", "/nowhere"], "no model at /nowhere"),
    ],
)
def test_bad_input_exits_2_with_a_message(args, message):
    result = run_verify(*args, timeout=120)
    assert result.returncode == 2, result.stderr[-2000:]
    assert message in result.stderr
    assert result.stdout == ""


@pytest.mark.engine
@pytest.mark.slow
def test_a_passing_connector_exits_0_with_a_table(tiny_model):
    result = run_verify(
        "--connector",
        "ExampleConnector",
        "--model",
        str(tiny_model),
        "--scenario",
        "cold_miss_then_hit",
    )
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert result.stdout.splitlines()[0].split() == ["scenario", "verdict", "evidence"]
    assert "cold_miss_then_hit [recompute]  pass" in result.stdout
    assert result.stdout.rstrip().endswith("ExampleConnector: PASS")
    assert "[verify] cold_miss_then_hit" in result.stderr  # progress, and vLLM's log, there


@pytest.mark.engine
@pytest.mark.slow
def test_a_broken_connector_exits_1_with_json_naming_the_rule(tiny_model):
    result = run_verify(
        "--connector",
        "tests.verify.planted:OverClaimingConnector",
        "--model",
        str(tiny_model),
        "--scenario",
        "cold_miss_then_hit",
        "--json",
    )
    assert result.returncode == 1, result.stdout + result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert report["passed"] is False
    (scenario,) = report["scenarios"]
    assert scenario["verdict"] == "FAIL"
    claims = [v for v in scenario["violations"] if v["rule"] == "claims_bounded"]
    assert claims and claims[0]["contract"] == report["rules"]["claims_bounded"]
    assert claims[0]["span"].startswith("kvscope.hook.get_num_new_matched_tokens ")
    assert claims[0]["request"].startswith("cold_miss_then_hit.first.")


@pytest.mark.engine
@pytest.mark.slow
def test_tensor_parallel_two_ranks_pass(tiny_model):
    """--tp 2: vLLM's multiprocessing executor with two worker ranks on the CPU (one core
    each); the offload connector's hit is loaded on both ranks and the tokens match."""
    result = run_verify(
        "--connector",
        "CpuOffloadConnector",
        "--tp",
        "2",
        "--model",
        str(tiny_model),
        "--scenario",
        "cold_miss_then_hit",
        "--json",
        timeout=400,
    )
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert report["passed"] is True and report["tensor_parallel_size"] == 2, report
    (scenario,) = report["scenarios"]
    assert scenario["verdict"] == "pass", scenario
