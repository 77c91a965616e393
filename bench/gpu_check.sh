#!/usr/bin/env bash
# GPU check of the engine-agnostic connector core (host pool, leases, copy engine, faults).
# For a machine with an NVIDIA GPU and torch but no network and no vLLM: runs the tests of
# connector/common (CUDA ones included) and the copy bandwidth benchmark on the GPU, then
# prints one table. kvscope need not be installed: the repository is mapped onto the kvscope
# namespace through a temporary folder. Needs pytest; CI skips this script.
# Usage: bash bench/gpu_check.sh [--mib N]   (PYTHON=... to pick the interpreter)
set -uo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
MIB=256
if [[ "${1:-}" == "--mib" && -n "${2:-}" ]]; then MIB="$2"; fi

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
ln -s "$REPO" "$WORK/kvscope"
export PYTHONPATH="$WORK${PYTHONPATH:+:$PYTHONPATH}"

echo "== environment"
if ! "$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "torch sees no CUDA device: run this on the GPU machine (or set PYTHON)." >&2
    exit 2
fi
"$PYTHON" -c "import torch; p = torch.cuda.get_device_properties(0); \
print(f'{p.name}, {p.total_memory / 2**30:.0f} GiB, torch {torch.__version__}, CUDA {torch.version.cuda}')"
if ! "$PYTHON" -c "import pytest" 2>/dev/null; then
    echo "pytest is missing: bring its wheels (pytest, pluggy, iniconfig, packaging) and" >&2
    echo "  $PYTHON -m pip install --no-index --find-links <wheel folder> pytest" >&2
    exit 2
fi

echo "== tests (tests/connector/common)"
# confcutdir keeps the repository-wide conftest (it wants the demo engine) out of this run.
(cd "$REPO" && timeout 600 "$PYTHON" -m pytest tests/connector/common -q -p no:cacheprovider \
    -o addopts="" --import-mode=importlib --confcutdir=tests/connector/common \
    --junitxml="$WORK/tests.xml" 2>&1 | tail -n 30)
TESTS_RC=${PIPESTATUS[0]}

echo "== copy bandwidth (pinned host <-> GPU)"
timeout 300 "$PYTHON" -m kvscope.bench.copy_bandwidth --device cuda --mib "$MIB" \
    | tee "$WORK/bench.txt"
BENCH_RC=${PIPESTATUS[0]}

echo "== summary"
"$PYTHON" - "$WORK/tests.xml" "$WORK/bench.txt" "$TESTS_RC" "$BENCH_RC" <<'PY'
import sys
import xml.etree.ElementTree as ElementTree

tests_xml, bench_txt, tests_rc, bench_rc = sys.argv[1:5]
rows = []
try:
    for case in ElementTree.parse(tests_xml).iter("testcase"):
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = child.tag
        group = "cuda" if "cuda" in case.get("classname", "") + case.get("name", "") else "cpu"
        rows.append((group, outcome))
except (OSError, ElementTree.ParseError) as exc:
    print(f"no test report ({exc})")
print(f"{'check':<28} {'result':<40}")
for group in ("cuda", "cpu"):
    counts = {}
    for row_group, outcome in rows:
        if row_group == group:
            counts[outcome] = counts.get(outcome, 0) + 1
    summary = ", ".join(f"{n} {outcome}" for outcome, n in sorted(counts.items())) or "none ran"
    print(f"{group + ' tests':<28} {summary:<40}")
with open(bench_txt) as bench:
    for line in bench:
        parts = line.split()
        if len(parts) >= 5 and parts[1] in ("store", "load"):
            label = f"bench {parts[0]} {parts[1]}"
            print(f"{label:<28} {parts[4]}x raw ({parts[2]} vs {parts[3]} GiB/s)")
cuda_passed = sum(1 for group, outcome in rows if group == "cuda" and outcome == "passed")
ok = tests_rc == "0" and bench_rc == "0" and cuda_passed > 0
verdict = "PASS" if ok else "FAIL"
print(f"{'verdict':<28} {verdict} (pytest rc {tests_rc}, bench rc {bench_rc}, "
      f"{cuda_passed} CUDA tests passed)")
sys.exit(0 if verdict == "PASS" else 1)
PY
