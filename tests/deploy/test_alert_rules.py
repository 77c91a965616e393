"""The shipped alert rules, checked and unit-tested by Prometheus's own promtool, with the
backend's thresholds."""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from kvscope.backend.queries.misses import alarms

ROOT = Path(__file__).parents[2]
RULES = ROOT / "deploy" / "prometheus" / "alerts.yml"
TESTS = Path(__file__).parent / "alerts_test.yml"


@pytest.fixture(scope="module")
def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        if os.environ.get("KVSCOPE_TEST_PROMTOOL") == "1":
            pytest.fail("KVSCOPE_TEST_PROMTOOL=1 but promtool is missing: run scripts/promtool.sh")
        pytest.skip("promtool is missing: scripts/promtool.sh installs Debian's prometheus")
    return found


def test_promtool_checks_the_rules(promtool):
    done = subprocess.run(
        [promtool, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 3 rules found" in done.stdout


def test_alarms_fire_for_a_cold_pool_and_not_for_a_healthy_one(promtool):
    done = subprocess.run(
        [promtool, "test", "rules", str(TESTS)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_rules_use_the_backends_thresholds():
    rules = {
        rule["alert"]: rule["expr"]
        for group in yaml.safe_load(RULES.read_text())["groups"]
        for rule in group["rules"]
    }
    never_read = rules["KVTierWrittenNeverRead"]
    assert f">= {alarms.MIN_BLOCKS}" in never_read
    assert f"<= {alarms.NEVER_READ_HIT_SHARE} *" in never_read
    dropped = rules["KVTierDroppedBeforeReuse"]
    assert f">= {alarms.DROPPED_SHARE}" in dropped and f">= {alarms.MIN_BLOCKS}" in dropped


def rule_metrics() -> set[str]:
    """The kvscope_backend_* series the rules read."""
    return set(re.findall(r"kvscope_backend_[a-z_]+", RULES.read_text()))
