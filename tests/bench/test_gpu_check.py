"""bench/gpu_check.sh's CPU dry run: every check's line, PASS, the page in $OUT, no vLLM needed."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from kvscope.bench.transfer.gpu_check_summary import CHECKS

REPO = Path(__file__).resolve().parents[2]
SUMMARY_LABELS = [label for label, _ in CHECKS] + ["verdict"]


def test_gpu_check_runs_every_step_on_the_cpu_and_writes_its_results(tmp_path):
    doc = REPO / "docs/bench/gpu.md"
    doc_before = doc.read_text() if doc.exists() else None
    # No PYTHON and no venv activated: the script finds the repository's venv itself.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHON", "VIRTUAL_ENV")}
    env["OUT"] = str(tmp_path)
    command = ["bash", "bench/gpu_check.sh", "--device", "cpu"]
    run = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    summary = (tmp_path / "summary.txt").read_text().splitlines()
    assert [line.split("  ")[0] for line in summary] == SUMMARY_LABELS, summary
    assert re.match(r"verdict +PASS", summary[-1]), summary
    lines = dict(zip(SUMMARY_LABELS, summary, strict=True))
    assert re.search(r"cpu: \d+ passed", lines["unit tests"]) and "rc 0" in lines["unit tests"]
    assert "10 of 10 byte-exact" in lines["round trips"]
    assert "ok" in lines["pinned pool"] and "n/a" in lines["no host sync"]
    report = json.loads((tmp_path / "copy_check.json").read_text())
    assert {trip["layout"] for trip in report["round_trips"]} == {
        "LBNHC",
        "LBHNC",
        "BLNHC",
        "LBHNC/k16",
        "LBNHC/k16",
    }
    assert all(trip["byte_exact"] and trip["others_untouched"] for trip in report["round_trips"])
    pool = report["pinned_pool"]
    assert pool["nbytes"] == pool["expected_bytes"] and pool["nbytes"] & (pool["nbytes"] - 1)
    figures = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    metrics = {figure["metric"] for figure in figures}
    assert {"load_after_compute_overlap_cpu", "decode_kernel_slowdown_cpu"} <= metrics
    assert "load_over_raw_scattered" in metrics
    page = (tmp_path / "gpu.md").read_text()
    assert "`--device cpu`" in page and all(f"| {label} |" in page for label in SUMMARY_LABELS)
    assert (doc.read_text() if doc.exists() else None) == doc_before, "a CPU run leaves docs/"


def test_the_committed_page_is_the_template_or_a_gpu_run():
    page = (REPO / "docs/bench/gpu.md").read_text()
    assert all(f"| {label} |" in page for label in SUMMARY_LABELS)
    assert "No GPU run has happened yet" in page or "`--device cuda`" in page


def test_the_copy_path_and_its_tests_import_without_vllm_nixl_or_opentelemetry():
    blocker = (
        "import sys\nfor name in ('vllm', 'nixl', 'opentelemetry'): sys.modules[name] = None\n"
    )
    script = (REPO / "bench/gpu_check.sh").read_text()
    modules = re.search(r"TEST_MODULES=\((.*?)\)", script, re.S).group(1).split()
    paths = sorted({path for pattern in modules for path in REPO.glob(pattern)})
    assert len(paths) >= 10, paths
    imports = [
        f"import tests.{'.'.join(p.relative_to(REPO / 'tests').with_suffix('').parts)}"
        for p in paths
        if "test_copy_views" not in p.name
    ]
    imports += [
        "import kvscope.bench.transfer.gpu_copy_check, kvscope.bench.transfer.copy_bandwidth",
        "import kvscope.bench.transfer.gpu_check_summary",
    ]
    run = subprocess.run(
        [sys.executable, "-c", blocker + "\n".join(imports)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr[-2000:]


def test_the_steps_time_limits_fit_one_eight_minute_command():
    script = (REPO / "bench/gpu_check.sh").read_text()
    limits = [int(seconds) for seconds in re.findall(r"\btimeout (\d+) ", script)]
    assert len(limits) >= 6 and sum(limits) <= 8 * 60, limits


def test_a_check_that_kills_the_process_leaves_the_earlier_checks_on_disk(tmp_path):
    out = tmp_path / "copy_check.json"
    crash = (
        "import os, kvscope.bench.transfer.gpu_copy_check as check\n"
        "check.check_decode_slowdown = lambda device: os._exit(3)\n"  # as a CUDA error aborts
        f"check.main(['--device', 'cpu', '--load-mib', '8', '--out', {str(out)!r}])\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", crash], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 3, run.stderr[-2000:]
    report = json.loads(out.read_text())
    assert len(report["round_trips"]) == 10 and report["pinned_pool"]["ok"]
    assert {"no_host_sync", "no_memory_growth", "overlap"} <= report.keys()
    assert "decode" not in report and report["ok"] is False
