#!/usr/bin/env bash
# GPU check of the copy path (issue 18): for a machine with a GPU, torch with CUDA and no
# network, vLLM or NIXL. Run from the repository root; results go under $OUT.
#   1. the tests of tests/connector/common (CUDA ones included; those needing vLLM skip),
#   2. bench/gpu_copy_check.py: byte-exact store/load on GPU memory with pinned host memory,
#      no host sync while submitting and polling, no device memory growth per job, and a
#      load overlapping a matmul on the compute stream,
#   3. bench/copy_bandwidth.py: engine store/load over a raw pinned copy_ of the same bytes.
# kvscope need not be installed: the repository is mapped onto the kvscope namespace.
# pytest is taken from build/gpu_deps when the interpreter has none: prepare that folder here
# with `bash bench/gpu_check.sh --prepare-deps` and carry it (about 15 MiB).
# Usage: bash bench/gpu_check.sh [--device cpu] [--mib N]   (PYTHON=..., OUT=...,
#   GPU_CHECK_PYTEST_ARGS="-k ..." to pick tests). --device cpu runs every step on the CPU.
set -uo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
DEPS="$REPO/build/gpu_deps"
DEVICE=cuda
MIB=256
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
OUT="${OUT:-$REPO/build/gpu_check}"
mkdir -p "$OUT"

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
ln -s "$REPO" "$WORK/kvscope"
export PYTHONPATH="$WORK${PYTHONPATH:+:$PYTHONPATH}"
if ! "$PYTHON" -c "import pytest" 2>/dev/null && [[ -d "$DEPS" ]]; then
    export PYTHONPATH="$PYTHONPATH:$DEPS"
fi
export KVSCOPE_BENCH_RESULTS="$OUT/results.jsonl"
rm -f "$KVSCOPE_BENCH_RESULTS"

echo "== environment" | tee "$OUT/summary.txt"
if [[ "$DEVICE" == cuda ]] && ! "$PYTHON" -c "import torch, sys; sys.exit(not torch.cuda.is_available())"; then
    echo "torch sees no CUDA device: run this on the GPU machine (or pass --device cpu)." >&2
    exit 2
fi
"$PYTHON" -c "import sys, torch; gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU'; \
print(f'python {sys.version.split()[0]}, torch {torch.__version__}, CUDA {torch.version.cuda}, {gpu}')" \
    | tee -a "$OUT/summary.txt"
if ! "$PYTHON" -c "import pytest" 2>/dev/null; then
    echo "pytest is missing: run 'bash bench/gpu_check.sh --prepare-deps' where it is installed" >&2
    echo "  and carry build/gpu_deps" >&2
    exit 2
fi

echo "== tests (tests/connector/common)"
# confcutdir keeps the repository-wide conftest (it wants the demo engine) out of this run.
# shellcheck disable=SC2086
(cd "$REPO" && timeout 600 "$PYTHON" -m pytest tests/connector/common -q -p no:cacheprovider \
    -o addopts="" --import-mode=importlib --confcutdir=tests/connector/common \
    --junitxml="$OUT/tests.xml" ${GPU_CHECK_PYTEST_ARGS:-} > "$OUT/tests.log" 2>&1)
TESTS_RC=$?
tail -n 15 "$OUT/tests.log"

echo "== copy engine on the device (gpu_copy_check)"
LOAD_MIB=$([[ "$DEVICE" == cuda ]] && echo 256 || echo 8)
timeout 300 "$PYTHON" -m kvscope.bench.gpu_copy_check --device "$DEVICE" --load-mib "$LOAD_MIB" \
    --out "$OUT/copy_check.json" | tee "$OUT/copy_check.txt"
CHECK_RC=${PIPESTATUS[0]}

echo "== copy bandwidth (pinned host <-> device, over a raw copy_)"
timeout 300 "$PYTHON" -m kvscope.bench.copy_bandwidth --device "$DEVICE" --mib "$MIB" \
    | tee "$OUT/bandwidth.txt"
BENCH_RC=${PIPESTATUS[0]}

echo "== summary"
"$PYTHON" -m kvscope.bench.gpu_check_summary "$OUT" "$DEVICE" "$TESTS_RC" "$CHECK_RC" "$BENCH_RC" \
    | tee -a "$OUT/summary.txt"
exit "${PIPESTATUS[0]}"
