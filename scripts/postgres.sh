#!/usr/bin/env bash
# Starts a throwaway PostgreSQL cluster on 127.0.0.1 (free port) for the backend's tests.
# Installs Debian's postgresql with apt-get if missing, and psycopg into the venv.
# stdout: one line, the DATABASE_URL (postgresql://postgres@127.0.0.1:PORT/postgres); progress
# goes to stderr. `scripts/postgres.sh stop [DIR]` stops and deletes one cluster, or every
# cluster this script started (/tmp/kvscope-postgres.*).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${KVSCOPE_VENV:-.venv}

say() { printf '==> %s\n' "$*" >&2; }

as_postgres() {
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

pg_bin() {
  local found
  found=$(command -v pg_ctl 2>/dev/null || true)
  if [ -z "$found" ]; then
    found=$(ls -d /usr/lib/postgresql/*/bin/pg_ctl 2>/dev/null | sort -V | tail -1 || true)
  fi
  [ -n "$found" ] && dirname "$found"
}

if [ "${1:-}" = stop ]; then
  BIN=$(pg_bin)
  for dir in ${2:-/tmp/kvscope-postgres.*}; do
    [ -d "$dir/data" ] || continue
    as_postgres "$BIN/pg_ctl" -D "$dir/data" -m immediate stop >&2 || true
    rm -rf "$dir"
    say "stopped and removed $dir"
  done
  exit 0
fi

if [ -z "$(pg_bin)" ]; then
  [ "$(id -u)" = 0 ] || { say "PostgreSQL is not installed; run this script as root to install it"; exit 1; }
  say "installing PostgreSQL (apt-get)"
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >&2
fi
BIN=$(pg_bin)

if ! "$VENV/bin/python" -c "import psycopg" 2>/dev/null; then
  say "installing the psycopg driver into $VENV"
  "$VENV/bin/pip" install --quiet "psycopg[binary]>=3.1" >&2
fi

if [ "$(id -u)" = 0 ] && ! id postgres >/dev/null 2>&1; then
  useradd --system --no-create-home postgres
fi
dir=$(mktemp -d /tmp/kvscope-postgres.XXXXXX)
chmod 755 "$dir"
[ "$(id -u)" = 0 ] && chown postgres "$dir"
port=$("$VENV/bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')

say "initdb in $dir/data"
as_postgres "$BIN/initdb" -D "$dir/data" -U postgres --auth=trust -E UTF8 >"$dir/initdb.log" 2>&1 \
  || { cat "$dir/initdb.log" >&2; exit 1; }
say "starting PostgreSQL on 127.0.0.1:$port"
as_postgres "$BIN/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
  -o "-p $port -k $dir -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off -c full_page_writes=off" \
  start >&2 || { cat "$dir/server.log" >&2; exit 1; }

say "running; stop it with: scripts/postgres.sh stop $dir"
echo "postgresql://postgres@127.0.0.1:$port/postgres"
