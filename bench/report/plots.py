"""PNG plots for the report: ratios against their targets, bench wall times, machine load."""

import math
import re
from pathlib import Path

from kvscope.bench.report.figures import target_bound
from kvscope.bench.report.machine import Machine
from kvscope.bench.report.runner import BenchRun
from kvscope.bench.report.table import Row

COLORS = {True: "#2e7d32", False: "#c62828", None: "#757575"}
STATUS_COLORS = {"ok": "#2e7d32", "failed": "#c62828", "timed out": "#ef6c00"}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only, never a window
    import matplotlib.pyplot as plt

    return plt


RATIO_AXIS_MAX = 2.5
"""Where the ratio axis ends: a 10x speed-up's bar runs off it (its label says how far), so the
ratios near 1 stay readable."""


def plot_ratios(rows: list[Row], path: Path) -> Path | None:
    """Horizontal bars, one per recorded ratio, with its target as a black tick."""
    shown = [
        r for r in rows if r.unit == "ratio" and r.value is not None and not math.isnan(r.value)
    ]
    if not shown:
        return None
    plt = _pyplot()
    figure, axes = plt.subplots(figsize=(9, 0.45 * len(shown) + 1.2))
    labels = [f"{r.bench}: {r.metric}" for r in shown]
    positions = range(len(shown))
    axes.barh(positions, [r.value for r in shown], color=[COLORS[r.met] for r in shown])
    for position, row in zip(positions, shown, strict=True):
        bound = target_bound(row.target)
        if bound is not None:
            axes.plot([bound, bound], [position - 0.4, position + 0.4], color="black", lw=2)
        axes.text(
            min(row.value, RATIO_AXIS_MAX), position, f" {row.value:.3f}", va="center", fontsize=8
        )
    axes.set_yticks(list(positions), labels, fontsize=8)
    axes.set_xlim(0, min(RATIO_AXIS_MAX, 1.1 * max(r.value for r in shown)))
    axes.invert_yaxis()
    axes.axvline(1.0, color="#9e9e9e", lw=0.8, ls="--")
    axes.set_xlabel("ratio (green: target met, red: not met; black tick: target)")
    axes.set_title("kvscope ratios measured side by side in one run")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


_TTFT = re.compile(r"^ttft_(recompute|hit|pd|single)_([a-z0-9-]+)_(\d+)_ms$")
TTFT_SERIES = {
    "recompute": "recompute (no connector)",
    "hit": "prefix from the offload pool",
    "single": "one server alone",
    "pd": "kvscope P/D pair",
}


def ttft_points(rows: list[Row]) -> dict[tuple[str, str], list[tuple[int, float]]]:
    """(series, shape) -> [(prefix tokens, median TTFT ms)] from the ttft_<series>_<shape>_<n>_ms
    figures offload_ttft and pd_latency record."""
    points: dict[tuple[str, str], list[tuple[int, float]]] = {}
    for row in rows:
        match = _TTFT.match(row.metric)
        if match and row.value is not None and not math.isnan(row.value):
            series, shape, tokens = match.groups()
            points.setdefault((series, shape), []).append((int(tokens), row.value))
    return {key: sorted(values) for key, values in points.items()}


def plot_ttft_vs_prefix(rows: list[Row], path: Path) -> Path | None:
    """TTFT against prefix length: recompute, offload hit, one server and the P/D pair."""
    points = ttft_points(rows)
    if not points:
        return None
    plt = _pyplot()
    figure, axes = plt.subplots(figsize=(7.5, 4.8))
    for (series, shape), values in sorted(points.items()):
        tokens, ms = zip(*values, strict=True)
        axes.plot(tokens, ms, marker="o", label=f"{TTFT_SERIES[series]} ({shape} model)")
        for x, y in values:
            axes.annotate(f"{y:.0f}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
    axes.set_yscale("log")
    axes.set_xlabel("prompt prefix length (tokens)")
    axes.set_ylabel("median TTFT (ms, log scale)")
    axes.set_title("Time to first token against prefix length")
    axes.grid(True, which="both", lw=0.3)
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def plot_runs(runs: list[BenchRun], machine: Machine, path: Path) -> Path | None:
    """Wall time of each bench (coloured by outcome), and the load average over the run."""
    ran = [run for run in runs if run.status != "not run"]
    if not ran:
        return None
    plt = _pyplot()
    figure, (bars, load) = plt.subplots(
        2, 1, figsize=(9, 0.4 * len(ran) + 4.2), height_ratios=[len(ran) + 1, 4]
    )
    bars.barh(
        range(len(ran)),
        [run.seconds for run in ran],
        color=[STATUS_COLORS.get(run.status, "#757575") for run in ran],
    )
    for position, run in enumerate(ran):
        bars.text(
            run.seconds, position, f" {run.seconds:.0f} s, {run.status}", va="center", fontsize=8
        )
    bars.margins(x=0.2)
    bars.set_yticks(range(len(ran)), [run.name for run in ran], fontsize=8)
    bars.invert_yaxis()
    bars.set_xlabel("wall time (s)")
    bars.set_title("bench wall times")
    if machine.loads:
        minutes = [seconds / 60 for seconds, _ in machine.loads]
        load.plot(minutes, [value for _, value in machine.loads], color="#1565c0")
    for run in ran:  # where each bench started
        minute = (run.started_at - machine.started) / 60
        load.axvline(minute, color="#bdbdbd", lw=0.6)
        load.text(minute, 0, f" {run.name}", rotation=90, va="bottom", fontsize=7)
    load.set_ylim(bottom=0)
    load.set_xlim(left=0)
    load.axhline(machine.cores, color="#9e9e9e", ls="--", lw=0.8, label=f"{machine.cores} cores")
    load.set_xlabel("minutes into the report run")
    load.set_ylabel("1-min load average")
    load.legend(loc="upper right", fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
