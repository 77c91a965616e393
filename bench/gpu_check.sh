#!/usr/bin/env bash
# GPU check of the copy path (issue 33), sized for the GPU machine as it is: Python 3.12, torch
# with CUDA, no vLLM, no NIXL, no OpenTelemetry, no network, 64 MiB carried. One command of at
# most 8 minutes: every step has its own timeout (probes 80 s, tests 140, copy check 150,
# bandwidth 90, summary 20: 480 s in all), and a step that fails or times out never stops the
# next. Run from anywhere; results go under $OUT.
#   1. tests: the torch-only modules of tests/connector/cpu_offload, CUDA ones included,
#   2. bench/transfer/gpu_copy_check.py (its JSON rewritten after every check, so a crash keeps the
#      earlier ones): a pinned pool of an odd size registered exactly; byte-exact
#      store/load over vLLM 0.32's views (LBNHC, LBHNC, BLNHC, kernel blocks); no host sync and
#      no device memory growth per job; a load queued after a step overlapping the next step;
#      decode-like kernels beside loads,
#   3. bench/transfer/copy_bandwidth.py: engine store/load over a raw pinned copy_ of the same bytes,
#   4. the summary: one line per check, and $OUT/gpu.md; on CUDA also docs/bench/gpu.md.
# kvscope need not be installed: the repository is mapped onto the kvscope namespace.
# pytest is taken from build/gpu_deps when the interpreter has none: prepare that folder here
# with `bash bench/gpu_check.sh --prepare-deps` and carry it (about 15 MiB).
# Usage: bash bench/gpu_check.sh [--device cpu] [--mib N]   (PYTHON=... to pick the interpreter,
#   else the repository's .venv or python3, whichever has a torch that fits; OUT=...,
#   GPU_CHECK_PYTEST_ARGS="-k ..." to pick tests). --device cpu runs every step on the CPU and
#   writes the report into $OUT only (the CI dry run).
set -uo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEPS="$REPO/build/gpu_deps"
DEVICE=cuda
MIB=""
while [[ $# -gt 0 ]]; do
    case "$1" in
        --device) DEVICE="$2"; shift 2 ;;
        --mib) MIB="$2"; shift 2 ;;
        --prepare-deps)
            SITE="$("$REPO/.venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
            rm -rf "$DEPS" && mkdir -p "$DEPS"
            for name in pytest _pytest pluggy iniconfig packaging pygments py.py; do
                cp -r "$SITE/$name" "$DEPS/"
            done
            cp -r "$SITE"/{pytest,pluggy,iniconfig,packaging,pygments}-*.dist-info "$DEPS/"
            find "$DEPS" -name __pycache__ -prune -exec rm -rf {} +
            echo "pytest and its dependencies in $DEPS ($(du -sh "$DEPS" | cut -f1)): carry build/gpu_deps"
            exit 0 ;;
        *) echo "unknown option $1: see the usage at the top of $0" >&2; exit 2 ;;
    esac
done
if [[ -z "$MIB" ]]; then MIB=$([[ "$DEVICE" == cuda ]] && echo 1024 || echo 4); fi

# The project's Python, activated or not: $PYTHON as given, else the first of the repository's
# venv and python3 whose torch imports (and, for --device cuda, sees a GPU).
find_python() {
    local candidate
    for candidate in "$REPO/.venv/bin/python" python3; do
        command -v "$candidate" >/dev/null 2>&1 || continue
        if timeout 20 "$candidate" -c "import sys, torch; sys.exit('$DEVICE' == 'cuda' and not torch.cuda.is_available())" 2>/dev/null; then
            echo "$candidate"
            return 0
        fi
    done
    return 1
}
if [[ -z "${PYTHON:-}" ]] && ! PYTHON="$(find_python)"; then
    echo "no Python here has a torch that sees a CUDA device (tried $REPO/.venv/bin/python and" \
        "python3): run this on the GPU machine, set PYTHON, or pass --device cpu." >&2
    exit 2
fi
OUT="${OUT:-$REPO/build/gpu_check}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"  # absolute: every step runs from the repository root
cd "$REPO" || exit 2

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
ln -s "$REPO" "$WORK/kvscope"
export PYTHONPATH="$WORK${PYTHONPATH:+:$PYTHONPATH}"
if ! timeout 10 "$PYTHON" -c "import pytest" 2>/dev/null && [[ -d "$DEPS" ]]; then
    export PYTHONPATH="$PYTHONPATH:$DEPS"
fi
export KVSCOPE_BENCH_RESULTS="$OUT/results.jsonl"
rm -f "$KVSCOPE_BENCH_RESULTS" "$OUT"/{tests.xml,copy_check.json,bandwidth.txt}

if [[ "$DEVICE" == cuda ]] && ! timeout 20 "$PYTHON" -c "import torch, sys; sys.exit(not torch.cuda.is_available())"; then
    echo "$PYTHON's torch sees no CUDA device: run this on the GPU machine (or pass --device cpu)." >&2
    exit 2
fi
timeout 20 "$PYTHON" -c "import sys, torch; gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU'; \
print(f'python {sys.version.split()[0]}, torch {torch.__version__}, CUDA {torch.version.cuda}, {gpu}')" \
    > "$OUT/environment.txt"
echo "== environment: $(cat "$OUT/environment.txt")"

# Modules that need torch alone; the others of tests/connector/cpu_offload want vLLM or OpenTelemetry.
TEST_MODULES=(tests/connector/cpu_offload/copy/test_copy_*.py
    tests/connector/cpu_offload/copy/test_host_pinning.py
    tests/connector/cpu_offload/copy/test_offload_flow.py tests/connector/cpu_offload/test_host_pool.py
    tests/connector/cpu_offload/test_leases.py tests/connector/cpu_offload/test_faults.py)
echo "== tests (${#TEST_MODULES[@]} torch-only modules of tests/connector/cpu_offload)"
if timeout 10 "$PYTHON" -c "import pytest" 2>/dev/null; then
    # confcutdir keeps the repository-wide conftest (it wants the demo engine) out of this run;
    # a module that cannot be collected is reported and the others still run.
    # shellcheck disable=SC2086
    timeout 140 "$PYTHON" -m pytest "${TEST_MODULES[@]}" -q -p no:cacheprovider \
        -o addopts="" --import-mode=importlib --confcutdir=tests/connector/cpu_offload \
        --continue-on-collection-errors --junitxml="$OUT/tests.xml" ${GPU_CHECK_PYTEST_ARGS:-} \
        > "$OUT/tests.log" 2>&1
    TESTS_RC=$?
    tail -n 5 "$OUT/tests.log"
else
    echo "pytest is missing: run 'bash bench/gpu_check.sh --prepare-deps' where it is installed" \
        "and carry build/gpu_deps" | tee "$OUT/tests.log"
    TESTS_RC=127
fi

echo "== copy engine on the device (gpu_copy_check)"
LOAD_MIB=$([[ "$DEVICE" == cuda ]] && echo 256 || echo 8)
timeout 150 "$PYTHON" -m kvscope.bench.transfer.gpu_copy_check --device "$DEVICE" --load-mib "$LOAD_MIB" \
    --out "$OUT/copy_check.json" > "$OUT/copy_check.txt" 2>&1
CHECK_RC=$?
tail -n 4 "$OUT/copy_check.txt"

echo "== copy bandwidth (pinned host <-> device, over a raw copy_)"
REPEATS=$([[ "$DEVICE" == cuda ]] && echo 15 || echo 5)
timeout 90 "$PYTHON" -m kvscope.bench.transfer.copy_bandwidth --device "$DEVICE" --mib "$MIB" \
    --repeats "$REPEATS" > "$OUT/bandwidth.txt" 2>&1
BENCH_RC=$?
tail -n 5 "$OUT/bandwidth.txt"

echo "== summary"
timeout 20 "$PYTHON" -m kvscope.bench.transfer.gpu_check_summary "$OUT" "$DEVICE" "$TESTS_RC" "$CHECK_RC" \
    "$BENCH_RC" --doc "$OUT/gpu.md" | tee "$OUT/summary.txt"
SUMMARY_RC=${PIPESTATUS[0]}
# On CUDA the page is also the repository's record (from a machine where only $OUT comes
# back, copy $OUT/gpu.md there).
[[ "$DEVICE" == cuda && -f "$OUT/gpu.md" ]] && cp "$OUT/gpu.md" "$REPO/docs/bench/gpu.md"
exit "$SUMMARY_RC"
