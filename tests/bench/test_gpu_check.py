"""bench/gpu_check.sh as the GPU machine runs it, here with --device cpu: every step runs,
the results land under $OUT, and the copy path imports without vLLM (absent there)."""

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_gpu_check_runs_every_step_on_the_cpu_and_writes_its_results(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, "OUT": str(tmp_path),
           "GPU_CHECK_PYTEST_ARGS": "-k copy_streams"}  # fmt: skip
    command = ["bash", "bench/gpu_check.sh", "--device", "cpu", "--mib", "4"]
    run = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=500)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    summary = (tmp_path / "summary.txt").read_text()
    assert "verdict" in summary and "PASS" in summary.splitlines()[-1], summary
    assert "round trips byte-exact         4 of 4" in summary
    report = json.loads((tmp_path / "copy_check.json").read_text())
    assert all(trip["byte_exact"] for trip in report["round_trips"])
    figures = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    metrics = {figure["metric"] for figure in figures}
    assert "load_matmul_overlap_cpu" in metrics and "load_over_raw_scattered" in metrics
    assert "passed" in (tmp_path / "tests.log").read_text()


def test_the_copy_path_and_its_tests_import_without_vllm():
    blocker = "import sys; sys.modules['vllm'] = None\n"  # `import vllm` now fails
    imports = "\n".join([
        "import kvscope.connector.common.copy_cuda, kvscope.connector.common.staging",
        "import kvscope.bench.gpu_copy_check, kvscope.bench.copy_bandwidth",
        "import tests.connector.common.fake_streams",
    ])  # fmt: skip
    run = subprocess.run([sys.executable, "-c", blocker + imports], cwd=REPO,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
