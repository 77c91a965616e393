"""bench/gpu_check.sh's results as one line per check, a verdict, and the gpu.md page."""

import argparse
import json
import sys
import time
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from kvscope.bench.transfer.copy_bandwidth import TARGET_RATIO

CUDA_TEST_MODULE: Final = "test_copy_cuda"
"""The module of tests that need a GPU (they skip elsewhere)."""
BANDWIDTH_GOAL: Final = TARGET_RATIO
"""Engine over raw pinned copy_ bandwidth, contiguous runs, on CUDA: copy_bandwidth's goal."""
CHECKS: Final = (
    ("unit tests", "the torch-only tests of tests/connector/cpu_offload; CUDA ones must pass"),
    (
        "pinned pool",
        "1.5 GiB + one block of host memory registered exactly, page-locked, "
        "torch's pinned allocator (power-of-two rounding) unused",
    ),
    (
        "round trips",
        "store then load, byte-exact, other blocks untouched, over vLLM 0.32's "
        "LBNHC, LBHNC, BLNHC and kernel-block views",
    ),
    ("no host sync", "submitting and polling make no synchronising CUDA call"),
    ("no memory growth", "jobs allocate no device memory after start (staging is reused)"),
    ("bandwidth", f"engine over a raw pinned copy_ of the same bytes (goal >= {BANDWIDTH_GOAL})"),
    ("load after compute", "a load queued after a step's forward hides behind the next step"),
    ("decode kernels", "time per decode-like kernel while loads run (<= 1.05x alone)"),
)
"""Each check's summary label and what it shows, in the order the script prints them."""


@dataclass(frozen=True)
class Row:
    label: str
    state: str  # ok, FAIL, n/a (does not apply on this device), info (measured, not judged)
    detail: str

    def line(self) -> str:
        return f"{self.label:<20} {self.state:<5} {self.detail}"


def count_tests(tests_xml: Path) -> dict[str, dict[str, int]]:
    """Outcomes per group: 'cuda' for the CUDA-only module's tests, 'cpu' for the rest."""
    counts: dict[str, dict[str, int]] = {"cuda": {}, "cpu": {}}
    try:
        cases = list(ElementTree.parse(tests_xml).iter("testcase"))
    except (OSError, ElementTree.ParseError):
        return counts
    for case in cases:
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = child.tag
        group = "cuda" if CUDA_TEST_MODULE in case.get("classname", "") else "cpu"
        counts[group][outcome] = counts[group].get(outcome, 0) + 1
    return counts


def tests_row(out: Path, device: str, tests_rc: str) -> Row:
    counts = count_tests(out / "tests.xml")
    text = "; ".join(
        f"{group}: " + (", ".join(f"{n} {o}" for o, n in sorted(counts[group].items())) or "none")
        for group in ("cuda", "cpu")
    )
    cuda_passed = counts["cuda"].get("passed", 0)
    ok = tests_rc == "0" and (device != "cuda" or cuda_passed > 0)
    return Row("unit tests", "ok" if ok else "FAIL", f"{text} (pytest rc {tests_rc})")


def state(check: dict) -> str:
    if not check.get("applies", True):
        return "n/a"
    return "ok" if check["ok"] else "FAIL"


def copy_check_rows(report: dict | None) -> list[Row]:
    if report is None:
        return [Row(label, "FAIL", "no report from gpu_copy_check") for label, _ in CHECKS[1:5]] + [
            Row(label, "FAIL", "no report") for label, _ in CHECKS[6:]
        ]
    pool = report["pinned_pool"]
    trips = report["round_trips"]
    bad = [f"{t['layout']}{' scattered' if t['scattered'] else ''}" for t in trips if not t["ok"]]
    layouts = sorted({t["layout"] for t in trips})
    pool_detail = (
        f"{pool['nbytes']} bytes ({pool['num_blocks']} blocks), registered "
        f"{pool['registered_bytes']}, page-locked {pool.get('page_locked', 'n/a')}, "
        f"torch's pinned allocator +{pool.get('allocator_growth_bytes', 0)} B"
    )
    overlap, decode = report["overlap"], report["decode"]
    direct, gathered = decode["direct"], decode["gathered"]
    return [
        Row(
            "pinned pool",
            state(pool) if pool["applies"] else ("ok" if pool["ok"] else "FAIL"),
            pool_detail,
        ),
        Row(
            "round trips",
            "ok" if not bad else "FAIL",
            f"{len(trips) - len(bad)} of {len(trips)} byte-exact ({', '.join(layouts)}; "
            f"contiguous and scattered){' failed: ' + ', '.join(bad) if bad else ''}",
        ),
        Row(
            "no host sync", state(report["no_host_sync"]), report["no_host_sync"].get("error") or ""
        ),
        Row(
            "no memory growth",
            state(report["no_memory_growth"]),
            f"{report['no_memory_growth'].get('peak_growth_bytes', '-')} B peak growth",
        ),
        Row(
            "load after compute",
            state(overlap) if overlap["applies"] else "info",
            f"overlap {overlap['overlap']:.2f} (>= 0.5): {overlap['load_mib']} MiB load "
            f"{overlap['load_s'] * 1e3:.1f} ms between steps of {overlap['step_s'] * 1e3:.1f} "
            f"ms, both {overlap['both_s'] * 1e3:.1f} ms",
        ),
        Row(
            "decode kernels",
            state(decode) if decode["applies"] else "info",
            f"{direct['slowdown']:.3f}x beside loads of block runs ({direct['kernel_us']:.1f} "
            f"-> {direct['kernel_with_load_us']:.1f} us); {gathered['slowdown']:.3f}x beside "
            "scattered (gathered) loads, not judged",
        ),
    ]


def bandwidth_row(bandwidth_txt: Path, device: str, bench_rc: str) -> Row:
    """From bench/copy_bandwidth's table: 'pattern direction engine raw ratio ...' lines."""
    ratios: dict[str, float] = {}
    lines = bandwidth_txt.read_text().splitlines() if bandwidth_txt.exists() else []
    for line in lines:
        parts = line.split()
        if len(parts) >= 5 and parts[1] in ("store", "load"):
            ratios[f"{parts[0]} {parts[1]}"] = float(parts[4])
    if bench_rc != "0" or not ratios:
        return Row("bandwidth", "FAIL", f"no figures (copy_bandwidth rc {bench_rc})")
    detail = ", ".join(f"{name} {ratio:.2f}x" for name, ratio in ratios.items())
    if device != "cuda":
        return Row("bandwidth", "info", f"{detail} raw copy_ (judged on CUDA only)")
    contiguous = [ratio for name, ratio in ratios.items() if name.startswith("contiguous")]
    met = bool(contiguous) and min(contiguous) >= BANDWIDTH_GOAL
    return Row("bandwidth", "ok" if met else "FAIL", f"{detail} raw pinned copy_")


def rows_of(out: Path, device: str, tests_rc: str, check_rc: str, bench_rc: str) -> list[Row]:
    report_path = out / "copy_check.json"
    report = json.loads(report_path.read_text()) if report_path.exists() else None
    rows = [tests_row(out, device, tests_rc), *copy_check_rows(report)]
    rows.insert(5, bandwidth_row(out / "bandwidth.txt", device, bench_rc))
    failed = [row.label for row in rows if row.state == "FAIL"]
    if check_rc != "0" and not failed:
        failed.append(f"gpu_copy_check rc {check_rc}")
    verdict = "PASS" if not failed else "FAIL"
    rows.append(Row("verdict", verdict, "failed: " + ", ".join(failed) if failed else ""))
    return rows


def markdown(rows: list[Row], status: str) -> str:
    meaning = dict(CHECKS)
    table = ["| check | result | measured | what it shows |", "|---|---|---|---|"]
    for row in rows:
        table.append(f"| {row.label} | {row.state} | {row.detail} | {meaning.get(row.label, '')} |")
    return "\n".join(
        [
            "# The copy path on a GPU",
            "",
            status,
            "",
            *table,
            "",
            "Made by `bash bench/gpu_check.sh` (one command of at most 8 minutes; torch with CUDA "
            "is all it needs: no vLLM, NIXL or OpenTelemetry). It writes this page when it runs on "
            "CUDA; `--device cpu` (the CI dry run) writes its page into `$OUT` only.",
            "",
        ]
    )


TEMPLATE_STATUS: Final = (
    "**No GPU run has happened yet.** The rows below are what the script fills in; the lead "
    "records here when a run on a GPU machine has been made."
)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("out", type=Path, nargs="?")
    parser.add_argument("device", nargs="?", default="cuda")
    parser.add_argument("rcs", nargs="*", default=["0", "0", "0"], help="pytest, check, bench")
    parser.add_argument("--doc", type=Path, help="where to write the markdown page")
    parser.add_argument("--template", action="store_true", help="the page before any run")
    args = parser.parse_args(argv)
    if args.template:
        rows = [Row(label, "-", "not run yet") for label, _ in CHECKS]
        page = markdown([*rows, Row("verdict", "-", "not run yet")], TEMPLATE_STATUS)
        (args.doc or Path("docs/bench/gpu.md")).write_text(page)
        return 0
    rows = rows_of(args.out, args.device, *args.rcs)
    for row in rows:
        print(row.line())
    environment_txt = args.out / "environment.txt"
    environment = environment_txt.read_text().strip() if environment_txt.exists() else "?"
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    status = f"Run on {when}, `--device {args.device}`: {environment}."
    if args.doc is not None:
        args.doc.write_text(markdown(rows, status))
    return 0 if rows[-1].state == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
