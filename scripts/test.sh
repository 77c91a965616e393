#!/usr/bin/env bash
# Runs lint and the whole test suite in the project's virtual environment (after setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${KVSCOPE_VENV:-.venv}

echo "==> lint (ruff)"
"$VENV/bin/ruff" check .
"$VENV/bin/ruff" format --check .
KVSCOPE_VENV=$VENV scripts/typecheck.sh
# `ruff format --check` checks only what is not exempted: nothing may be exempted.
if grep -rn --include='*.py' -E '#[[:space:]]*fmt:[[:space:]]*(skip|off)' --exclude-dir='.venv*' --exclude-dir=build . ; then
  echo "lint: the lines above exempt themselves from ruff format; let it lay them out" >&2
  exit 1
fi

# The docs site: a broken link or anchor, or a page left out of the nav, fails the build.
echo "==> docs (mkdocs build --strict)"
NO_MKDOCS_2_WARNING=1 "$VENV/bin/mkdocs" build --strict --quiet --site-dir build/site

# PostgreSQL for the backend's tests: started when asked (CI asks), skipped with a reason otherwise.
if [ "${KVSCOPE_TEST_POSTGRES:-0}" = 1 ] && [ -z "${KVSCOPE_TEST_POSTGRES_URL:-}" ] && [ -x scripts/postgres.sh ]; then
  echo "==> starting a throwaway PostgreSQL on 127.0.0.1"
  pg_log=$(mktemp)
  KVSCOPE_TEST_POSTGRES_URL=$(scripts/postgres.sh 2>"$pg_log" | tail -n 1)
  cat "$pg_log" >&2
  export KVSCOPE_TEST_POSTGRES_URL
  # Stopped and deleted when the tests end, whatever their outcome.
  pg_dir=$(sed -n 's|.*scripts/postgres.sh stop ||p' "$pg_log" | tail -n 1)
  rm -f "$pg_log"
  if [ -n "$pg_dir" ]; then
    trap 'scripts/postgres.sh stop "$pg_dir" >/dev/null 2>&1 || true' EXIT
  fi
fi

# Chromium for the dashboard's browser tests: installed when asked (CI asks), else skipped.
if [ "${KVSCOPE_TEST_BROWSER:-0}" = 1 ]; then
  scripts/browser.sh
fi

# promtool for the alert rules' tests: installed when asked (CI asks), else skipped.
if [ "${KVSCOPE_TEST_PROMTOOL:-0}" = 1 ]; then
  scripts/promtool.sh
fi

# Two workers (xdist), each given whole modules so that a module's engines and servers are
# shared by its tests: on 2 cores the suite's engines, servers and waits overlap (42 -> 22 min
# here). Three workers were slower (25 min against 22.8, clean clone, one afternoon): the
# cores were busy 89% of that run, so a third worker only adds contention.
# KVSCOPE_TEST_WORKERS=0 runs it in one process; an explicit -n in "$@" wins.
WORKERS=${KVSCOPE_TEST_WORKERS:-2}
echo "==> tests (pytest, $WORKERS workers)"
"$VENV/bin/pytest" -n "$WORKERS" --dist loadfile "$@"

# vLLM 0.34 (CUDA wheels only) cannot run an engine here: its own scheduler, KV cache and
# connector code run the tests that need none (scripts/vllm_lane.sh).
# Then vLLM's own connector tests, bare and wrapped by kvscope, on each release's code (about
# 9 min for 0.32's three runs, 8 for 0.34's two; its Multi run is
# KVSCOPE_VLLM_TESTS_WRAPS=multi, which here finds what 0.32's does).
if [ $# -eq 0 ]; then
  KVSCOPE_VENV=$VENV scripts/vllm_lane.sh -q
  KVSCOPE_VENV=$VENV scripts/vllm_tests/lane.sh
  KVSCOPE_VENV=".venv-vllm${KVSCOPE_LANE_VLLM:-0.34.0}" KVSCOPE_VLLM_TESTS_WRAPS=traced \
    scripts/vllm_tests/lane.sh
fi
