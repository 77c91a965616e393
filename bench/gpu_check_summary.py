"""One table and a verdict from what bench/gpu_check.sh left in its output folder."""

import json
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path


def count_tests(tests_xml: Path) -> dict[str, dict[str, int]]:
    """Outcomes per group: 'cuda' for CUDA tests (by module or name), 'cpu' for the rest."""
    counts: dict[str, dict[str, int]] = {"cuda": {}, "cpu": {}}
    try:
        cases = list(ElementTree.parse(tests_xml).iter("testcase"))
    except (OSError, ElementTree.ParseError) as exc:
        print(f"no test report ({exc})")
        return counts
    for case in cases:
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = child.tag
        group = "cuda" if "cuda" in case.get("classname", "") + case.get("name", "") else "cpu"
        counts[group][outcome] = counts[group].get(outcome, 0) + 1
    return counts


def bandwidth_rows(bandwidth_txt: Path) -> list[str]:
    """'pattern direction engine raw ratio ...' lines of bench/copy_bandwidth's table."""
    rows = []
    for line in bandwidth_txt.read_text().splitlines() if bandwidth_txt.exists() else []:
        parts = line.split()
        if len(parts) >= 5 and parts[1] in ("store", "load"):
            label = f"bandwidth {parts[0]} {parts[1]}"
            rows.append(f"{label:<30} {parts[4]}x raw copy_ ({parts[2]} vs {parts[3]} GiB/s)")
    return rows


def copy_check_rows(copy_check_json: Path) -> list[str]:
    if not copy_check_json.exists():
        return [f"{'copy check':<30} no report"]
    report = json.loads(copy_check_json.read_text())
    trips = report["round_trips"]
    rows = [f"{'round trips byte-exact':<30} {sum(t['ok'] for t in trips)} of {len(trips)}"]
    for name in ("no_host_sync", "no_memory_growth"):
        check = report[name]
        state = ("ok" if check["ok"] else "FAIL") if check["applies"] else "n/a"
        rows.append(
            f"{name:<30} {state} {check.get('error') or check.get('peak_growth_bytes', '')}"
        )
    overlap = report["overlap"]
    rows.append(f"{'load/matmul overlap':<30} {overlap['overlap']:.2f} "
                f"(compute slowed {overlap['compute_slowdown']:.2f}x)")  # fmt: skip
    return rows


def main(argv: list[str]) -> int:
    out, device, tests_rc, check_rc, bench_rc = Path(argv[0]), argv[1], *argv[2:5]
    counts = count_tests(out / "tests.xml")
    for group in ("cuda", "cpu"):
        text = ", ".join(f"{n} {o}" for o, n in sorted(counts[group].items())) or "none ran"
        print(f"{group + ' tests':<30} {text}")
    for row in copy_check_rows(out / "copy_check.json") + bandwidth_rows(out / "bandwidth.txt"):
        print(row)
    cuda_passed = counts["cuda"].get("passed", 0)
    ok = (tests_rc, check_rc, bench_rc) == ("0", "0", "0") and (device != "cuda" or cuda_passed)
    rcs = f"pytest rc {tests_rc}, copy check rc {check_rc}, bandwidth rc {bench_rc}"
    print(f"{'verdict':<30} {'PASS' if ok else 'FAIL'} ({rcs}, {cuda_passed} CUDA tests passed)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
