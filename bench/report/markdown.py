"""The report as Markdown: machine header, figure table, bench runs, tails of failed logs."""

import os
import time
from pathlib import Path

from kvscope.bench.report.machine import Machine
from kvscope.bench.report.runner import BenchRun
from kvscope.bench.report.table import Row, format_value, verdict
from kvscope.bench.report.unmet import unmet_section


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def _link(path: Path | None, out_dir: Path) -> str:
    return f"[log]({os.path.relpath(path, out_dir)})" if path is not None else ""


def machine_section(machine: Machine) -> list[str]:
    made = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(machine.started))
    facts = [
        ("date", made),
        ("git commit", machine.commit),
        ("CPU", f"{machine.cpu}, {machine.cores} cores"),
        ("memory", f"{machine.memory_gib:.1f} GiB"),
        ("GPU", machine.gpus),
        ("OS", machine.os),
        ("Python / torch / vLLM", f"{machine.python} / {machine.torch} / {machine.vllm}"),
        (
            "load average (1 min)",
            f"{machine.load_start:.2f} at start, {machine.load_end:.2f} at end",
        ),
        ("other work running", machine.other_work()),
    ]
    return [
        "## Machine",
        "",
        "| | |",
        "| --- | --- |",
        *(f"| {key} | {_cell(value)} |" for key, value in facts),
        "",
    ]


def figures_section(rows: list[Row], ratios_png: Path | None) -> list[str]:
    lines = [
        "## Figures",
        "",
        "| figure | value | target | met | bench | note |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for row in (r for r in rows if r.expected):
        lines.append(_figure_line(row))
    if ratios_png is not None:
        lines += ["", f"![ratios against their targets]({ratios_png.name})"]
    others = [row for row in rows if not row.expected]
    if others:
        lines += [
            "",
            "### Other recorded figures",
            "",
            "Recorded under names the expected list (`bench/report/figures/`) lacks:",
            "",
            "| figure | value | target | met | bench | note |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        lines += [_figure_line(row) for row in others]
    return [*lines, ""]


def _figure_line(row: Row) -> str:
    value = row.missing_why if row.value is None else format_value(row.value, row.unit)
    name = f"{row.label} (`{row.metric}`)" if row.label != row.metric else f"`{row.metric}`"
    return (
        f"| {_cell(name)} | {_cell(value)} | {_cell(row.target or '—')} | {verdict(row)} "
        f"| {row.bench} | {_cell(row.note)} |"
    )


def runs_section(runs: list[BenchRun], out_dir: Path, runs_png: Path | None) -> list[str]:
    lines = [
        "## Benches",
        "",
        "| bench | status | wall time | timeout | load start → end | figures recorded "
        "| arguments | log |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for run in runs:
        status = run.status + (f": {run.reason}" if run.reason else "")
        if run.dropped_flags:
            status += f" (dropped {' '.join(run.dropped_flags)}: the bench lacks them)"
        args = " ".join(run.argv[3:]) if run.argv[1:2] == ["-m"] else " ".join(run.argv)
        load = "" if run.status == "not run" else f"{run.load_start:.2f} → {run.load_end:.2f}"
        lines.append(
            f"| {run.name} | {_cell(status)} | {_minutes(run.seconds)} | "
            f"{_minutes(run.timeout_s)} | {load} | {len(run.figures)} | "
            f"`{_cell(args) or '(defaults)'}` | "
            f"{_link(run.log_path, out_dir)} |"
        )
    if runs_png is not None:
        lines += ["", f"![bench wall times and load average]({runs_png.name})"]
    for run in runs:
        if run.status in ("failed", "timed out"):
            lines += [
                "",
                f"### {run.name}: {run.status} ({run.reason})",
                "",
                "Last lines of its log:",
                "",
                "```",
                run.log_tail(),
                "```",
            ]
    return [*lines, ""]


def render(
    machine: Machine,
    runs: list[BenchRun],
    rows: list[Row],
    out_dir: Path,
    command: str,
    plots: dict[str, Path | None],
) -> str:
    """The whole report; plots maps "ratios", "runs" and "ttft_vs_prefix" to PNG paths in
    out_dir (or None)."""
    ok = sum(run.status == "ok" for run in runs)
    judged = [row for row in rows if row.expected and row.met is not None]
    total_s = sum(run.seconds for run in runs)
    summary = (
        f"Made by `{command}`. {ok} of {len(runs)} benches finished; "
        f"{sum(bool(row.met) for row in judged)} of {len(judged)} figures with a target and a "
        f"value meet it; {sum(row.value is None for row in rows if row.expected)} of "
        f"{sum(row.expected for row in rows)} expected figures have no value. "
        f"Benches ran for {_minutes(total_s)} in all."
    )
    lines = ["# kvscope benchmark report", "", summary, ""]
    if "--quick" in command:
        lines += [
            "Quick sizes (`--quick`): each bench ran small, so the figures are indicative; "
            "`make bench` runs the full sizes.",
            "",
        ]
    lines += [
        "Every ratio is measured side by side in one run of its bench (the baseline and "
        "kvscope alternate on the same machine), so load from other work hits both; "
        "absolute rates and times are only as good as the load average below allows.",
        "",
    ]
    lines += machine_section(machine)
    lines += figures_section(rows, plots.get("ratios"))
    lines += unmet_section(rows)
    if plots.get("ttft_vs_prefix") is not None:
        lines += [f"![TTFT against prefix length]({plots['ttft_vs_prefix'].name})", ""]
    lines += runs_section(runs, out_dir, plots.get("runs"))
    return "\n".join(lines)
