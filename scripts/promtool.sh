#!/usr/bin/env bash
# Installs Debian's prometheus package for its promtool (the alert rules' tests) when missing.
set -euo pipefail
if command -v promtool >/dev/null; then
  exit 0
fi
echo "==> installing promtool (apt-get: Debian's prometheus package) for the alert rules' tests"
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
$SUDO apt-get update -qq
# The package's daemon is not wanted: policy-rc.d keeps it from starting where that applies.
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends prometheus >/dev/null
promtool --version | head -n 1
