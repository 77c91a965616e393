#!/usr/bin/env bash
# Installs Debian's Chromium for the dashboard's browser tests when it is missing (idempotent).
set -euo pipefail
if [ -x /usr/bin/chromium ]; then
  exit 0
fi
echo "==> installing chromium (apt-get) for the dashboard browser tests"
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null
/usr/bin/chromium --version
