"""The benchmark report on fake benches: figure table, failed and timed-out rows, plots."""

import json
import sys
import textwrap
from pathlib import Path

from kvscope.bench.report.__main__ import (
    report_records,
    run_report,
    standing_records,
    write_report,
)
from kvscope.bench.report.benches import BENCHES, BenchSpec
from kvscope.bench.report.figures import FIGURES, target_met
from kvscope.bench.report.saved import load_run
from kvscope.bench.report.table import build_rows
from kvscope.bench.report.unmet import NOTES

RECORDING = textwrap.dedent("""
    from kvscope.bench.common.results import record
    print("measuring...")
    record("copy_bandwidth", "store_over_raw_contiguous", 0.95, "ratio", ">= 0.9", "fast")
    record("copy_bandwidth", "load_over_raw_contiguous", 0.5, "ratio", ">= 0.9", "slow")
    record("copy_bandwidth", "mystery_ratio", 1.25, "ratio", ">= 1", "a new name")
""")
FAILING = "import sys; print('loading the model'); print('boom: no model here'); sys.exit(3)"


def leaving_a_child(child_s: float) -> str:
    """A bench that exits at once, its child child_s later."""
    child = f"import time; time.sleep({child_s})"
    return f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {child!r}])"


def hanging(marker: str) -> str:
    """A bench that never ends; `marker` in its command line finds it (and any survivor)."""
    return f"import time; time.sleep(60)  # {marker}"


def python_bench(name: str, code: str, timeout_s: float = 20) -> BenchSpec:
    return BenchSpec(name, [sys.executable, "-c", code], quick_timeout_s=timeout_s)


def row_of(report: str, metric: str) -> str:
    [row] = [line for line in report.splitlines() if line.startswith("|") and f"`{metric}`" in line]
    return row


def test_report_from_fake_benches(tmp_path: Path) -> None:
    marker = f"hanging bench of {tmp_path}"
    benches = [
        python_bench("copy_bandwidth", RECORDING),
        python_bench("offload_ttft", FAILING),
        python_bench("ingest", hanging(marker), timeout_s=1),
        python_bench("nixl_bandwidth", leaving_a_child(child_s=1)),
        python_bench("telemetry_isolation", leaving_a_child(child_s=60)),
    ]
    report_path = run_report(benches, tmp_path / "out", quick=True, command="report --quick")
    report = report_path.read_text()

    assert "| figure | value | target | met | bench | note |" in report
    assert "cores" in report and "load average (1 min)" in report
    met = row_of(report, "store_over_raw_contiguous")
    assert "| 0.950 | >= 0.95 | yes | copy_bandwidth | fast |" in met
    assert "| 0.500 | >= 0.95 | **no** |" in row_of(report, "load_over_raw_contiguous")
    assert "| bench failed |" in row_of(report, "ttft_hit_over_recompute_mid")
    assert "| bench timed out |" in row_of(report, "sqlite_timeline_p95_ms")
    assert "| not run |" in row_of(report, "ttft_over_stock")
    assert "`ttft_over_single_mid`" not in report  # only full runs record it (the mid model)
    assert "### Other recorded figures" in report
    unmet = report[report.index("## Unmet targets") : report.index("## Benches")]
    assert "`load_over_raw_contiguous`** (copy_bandwidth, target >= 0.95): " in unmet
    assert NOTES[("copy_bandwidth", "load_over_raw_contiguous")] in unmet
    assert "store_over_raw_contiguous" not in unmet  # met
    assert "| 1.250 | >= 1 | yes | copy_bandwidth |" in row_of(report, "mystery_ratio")
    # Expected figures keep the order of FIGURES whatever order they were recorded in.
    assert report.index("`load_over_raw_contiguous`") < report.index("`load_over_raw_scattered`")

    assert "### offload_ttft: failed (exit status 3)" in report
    assert "boom: no model here" in report  # the tail of its log
    assert "### ingest: timed out" in report
    # A child still exiting is waited for; one that stays is killed and named.
    assert "| nixl_bandwidth | ok |" in report
    assert "| telemetry_isolation | ok: left processes behind (killed) |" in report
    # Killed at its timeout, whether or not it had started running its code by then.
    assert _running_with(marker) == []

    out = report_path.parent
    assert (out / "logs" / "offload_ttft.log").read_text().endswith("boom: no model here\n")
    for plot in ("ratios.png", "runs.png"):
        assert (out / plot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"]({plot})" in report

    # Rewritten from the saved run alone (no bench runs): the same report.
    (out / "README.md").unlink()
    assert write_report(out, *load_run(out)).read_text() == report


def _running_with(marker: str) -> list[int]:
    """Processes (zombies aside) whose command line holds marker."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            command = (proc / "cmdline").read_bytes().decode(errors="replace")
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue  # not a process, or gone meanwhile
        if marker in command and state != "Z":
            found.append(int(proc.name))
    return found


def test_targets_and_the_expected_list() -> None:
    assert target_met(0.95, ">= 0.9") is True
    assert target_met(51.0, "<= 50 ms") is False
    assert target_met(0.0, "== 0") is True
    assert target_met(float("nan"), ">= 0.9") is False
    assert target_met(1.0, "") is None
    keys = [(figure.bench, figure.metric) for figure in FIGURES]
    assert len(keys) == len(set(keys)), "a figure is listed twice"
    assert {bench for bench, _ in keys} <= {spec.name for spec in BENCHES}
    targeted = {(figure.bench, figure.metric) for figure in FIGURES if figure.target}
    assert set(NOTES) <= targeted, "a note on unmet targets names no figure with a target"


def test_ttft_against_prefix_length_is_plotted_from_the_recorded_medians(tmp_path: Path) -> None:
    from kvscope.bench.report.plots import plot_ttft_vs_prefix, ttft_points
    from kvscope.bench.report.table import Row

    def row(metric: str, value: float) -> Row:
        return Row("offload_ttft", metric, metric, "ms", "", value, "", "", expected=False)

    rows = [
        row("ttft_recompute_mid_4096_ms", 4800.0),
        row("ttft_recompute_mid_1024_ms", 700.0),
        row("ttft_hit_mid_1024_ms", 35.0),
        row("ttft_hit_over_recompute_mid", 0.03),
    ]
    assert ttft_points(rows) == {
        ("recompute", "mid"): [(1024, 700.0), (4096, 4800.0)],
        ("hit", "mid"): [(1024, 35.0)],
    }
    path = plot_ttft_vs_prefix(rows, tmp_path / "ttft.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert plot_ttft_vs_prefix(rows[-1:], tmp_path / "none.png") is None


def test_a_full_report_leaves_out_what_only_quick_runs_record() -> None:
    recorded = {"bench": "pd_latency", "metric": "ttft_over_stock_uniproc", "value": 0.4}
    rows = {row.metric: row for row in build_rows([], [recorded], quick=False)}
    assert "ttft_over_stock" not in rows and "ttft_over_single" not in rows  # tiny model
    assert rows["ttft_over_stock_uniproc"].value == 0.4  # recorded anyway: shown
    assert rows["ttft_over_single_mid"].missing_why == "not run"
    assert "ttft_over_single_mid" not in {r.metric for r in build_rows([], [], quick=True)}
    assert len(build_rows([], [])) == len(FIGURES)  # size unknown: every figure


def test_standing_files_fill_only_expected_figures(tmp_path: Path) -> None:
    lines = [
        {"bench": "scale", "metric": "sqlite_summary_p95_ms_10m", "value": 30.0},
        {"bench": "scale", "metric": "sqlite_summary_p95_ms_1m", "value": 20.0},
    ]
    (tmp_path / "scale_10m_followup.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert [r["metric"] for r in standing_records(tmp_path)] == ["sqlite_summary_p95_ms_10m"]
    scale_out = {"bench": "scale_out", "metric": "spans_per_s_2_backends_over_1", "value": 1.5}
    (tmp_path / "scale_out.jsonl").write_text(json.dumps(scale_out) + "\n")
    ingest = {"bench": "ingest", "metric": "sqlite_spans_per_backend_cpu_s", "value": 2e4}
    (tmp_path / "ingest_1m.jsonl").write_text(json.dumps(ingest) + "\n")
    assert [r["metric"] for r in standing_records(tmp_path)] == [
        "sqlite_summary_p95_ms_10m",
        "spans_per_s_2_backends_over_1",
        "sqlite_spans_per_backend_cpu_s",
    ]


def test_a_standing_figure_newer_than_the_runs_wins(tmp_path: Path) -> None:
    def line(value: float, time: float) -> str:
        metric = "sqlite_ingest_10m_over_empty"
        return json.dumps({"bench": "scale", "metric": metric, "value": value, "time": time})

    (tmp_path / "results.jsonl").write_text(line(1.07, 100.0) + "\n")
    (tmp_path / "scale_10m_old.jsonl").write_text(line(0.54, 50.0) + "\n")
    (tmp_path / "scale_10m_new.jsonl").write_text(line(0.99, 200.0) + "\n")
    rows = {row.metric: row for row in build_rows([], report_records(tmp_path))}
    assert rows["sqlite_ingest_10m_over_empty"].value == 0.99
    (tmp_path / "scale_10m_new.jsonl").unlink()
    rows = {row.metric: row for row in build_rows([], report_records(tmp_path))}
    assert rows["sqlite_ingest_10m_over_empty"].value == 1.07  # the run's, newer than 0.54
