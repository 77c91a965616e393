#!/usr/bin/env bash
# Type-checks kvscope's product code with mypy (config: pyproject.toml [tool.mypy]).
# The top-level folders are installed as kvscope.<folder> by package-dir mapping, which mypy
# cannot follow: build/typecheck/kvscope/<folder> links each folder back under that name.
# PACKAGES lists the packages held clean; a package joins it once mypy passes on it.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${KVSCOPE_VENV:-.venv}
FOLDERS=(cli model connector traces backend dashboard demo bench verify harness deploy)
PACKAGES=(backend dashboard cli deploy demo harness verify model traces)

root=build/typecheck
mkdir -p "$root/kvscope"
for folder in "${FOLDERS[@]}"; do
  ln -sfn "../../../$folder" "$root/kvscope/$folder"
done

args=()
for package in "${PACKAGES[@]}"; do
  args+=(-p "kvscope.$package")
done
echo "==> lint (mypy: ${PACKAGES[*]})"
cd "$root"
exec "../../$VENV/bin/mypy" --config-file ../../pyproject.toml "${args[@]}" "$@"
