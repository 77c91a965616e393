"""`python -m kvscope.bench.report [--quick] [--out DIR] [--only NAME...]`: runs every bench and
writes the Markdown report with its plots (docs/bench/README.md by default)."""

import argparse
import sys
import time
from pathlib import Path

from kvscope.bench.common.results import load
from kvscope.bench.report.benches import BENCHES, BenchSpec
from kvscope.bench.report.figures import FIGURES, canonical
from kvscope.bench.report.machine import REPO, Machine
from kvscope.bench.report.markdown import render
from kvscope.bench.report.plots import plot_ratios, plot_runs, plot_ttft_vs_prefix
from kvscope.bench.report.runner import BenchRun, run_bench
from kvscope.bench.report.saved import RUN_FILE, load_run, save_run
from kvscope.bench.report.table import build_rows

DEFAULT_OUT = REPO / "docs" / "bench"


def run_report(
    benches: list[BenchSpec],
    out_dir: Path,
    quick: bool,
    command: str,
    timeout_factor: float = 1.0,
) -> Path:
    """Runs the benches one after another, then writes README.md and plots into out_dir."""
    out_dir.mkdir(parents=True, exist_ok=True)
    results_path = out_dir / "results.jsonl"
    results_path.unlink(missing_ok=True)  # this run's figures only
    machine = Machine()
    stop_sampling = machine.sample_loads()
    runs: list[BenchRun] = []
    for index, spec in enumerate(benches, 1):
        print(f"[{index}/{len(benches)}] {spec.name} ...", flush=True)
        run = run_bench(spec, quick, results_path, out_dir / "logs", timeout_factor)
        runs.append(run)
        print(
            f"[{index}/{len(benches)}] {spec.name}: {run.status} in {run.seconds:.0f} s"
            f"{f' ({run.reason})' if run.reason else ''}, {len(run.figures)} figures",
            flush=True,
        )
    stop_sampling.set()
    machine.finish()
    save_run(out_dir, machine, runs, command)
    return write_report(out_dir, machine, runs, command)


STANDING = (
    "scale_10m*.jsonl",
    "scale_out*.jsonl",
    "ingest_*.jsonl",
    "copy_bandwidth_*.jsonl",
    "tracing_overhead_*.jsonl",
    "nixl_bandwidth_*.jsonl",
    "convoy_bursts_*.jsonl",
)
"""Figures of runs made outside a report run (the 10M-span fills, the scale-out bench's own
runs, the ingest bench's at 1M spans, the copy bench's after a change to the copy engine, the
tracing bench's with more rounds, the P2P READ bench's after a change to its design, the convoy
bench's own run), kept
beside the report: they fill expected rows; of two records of one figure the newer wins (a run
on its own after the report's run, on newer code, replaces that run's figure)."""


def standing_records(out_dir: Path) -> list[dict]:
    """The standing files' records of expected figures (their other figures stay in them)."""
    expected = {(figure.bench, figure.metric) for figure in FIGURES}
    return [
        record
        for pattern in STANDING
        for path in sorted(out_dir.glob(pattern))
        for record in load(path)
        if (record["bench"], canonical(record["bench"], record["metric"])) in expected
    ]


def report_records(out_dir: Path) -> list[dict]:
    """The run's records and the standing ones, oldest first (the newest of a figure wins)."""
    records = standing_records(out_dir) + load(out_dir / "results.jsonl")
    return sorted(records, key=lambda record: record.get("time", 0.0))  # stable


def write_report(out_dir: Path, machine: Machine, runs: list[BenchRun], command: str) -> Path:
    """README.md and the plots from a run's results (figure names as FIGURES has them now)."""
    rows = build_rows(runs, report_records(out_dir), quick="--quick" in command)
    plots = {
        "ratios": plot_ratios(rows, out_dir / "ratios.png"),
        "runs": plot_runs(runs, machine, out_dir / "runs.png"),
        "ttft_vs_prefix": plot_ttft_vs_prefix(rows, out_dir / "ttft_vs_prefix.png"),
    }
    report = out_dir / "README.md"
    report.write_text(render(machine, runs, rows, out_dir, command, plots) + "\n")
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes (~10-15 minutes)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="report folder")
    parser.add_argument(
        "--only",
        nargs="+",
        metavar="NAME",
        choices=[b.name for b in BENCHES],
        help="run only these benches (the others show as not run)",
    )
    parser.add_argument(
        "--timeout-factor",
        type=float,
        default=1.0,
        help="multiply every bench's timeout (slow machines)",
    )
    parser.add_argument(
        "--rerender",
        action="store_true",
        help="run nothing: rewrite the report in --out from its saved results "
        "(after renaming figures in figures/)",
    )
    args = parser.parse_args(argv)
    if args.rerender:
        if not (args.out / RUN_FILE).exists():
            parser.error(f"{args.out / RUN_FILE} is missing: run the benches first (no --rerender)")
        print(f"report rewritten: {write_report(args.out, *load_run(args.out))}")
        return 0
    benches = [b for b in BENCHES if not args.only or b.name in args.only]
    command = "python -m kvscope.bench.report " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    started = time.monotonic()
    report = run_report(benches, args.out, args.quick, command.strip(), args.timeout_factor)
    print(f"report written to {report} after {(time.monotonic() - started) / 60:.1f} min")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
