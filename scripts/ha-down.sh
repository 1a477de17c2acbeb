#!/usr/bin/env bash
# Stops what scripts/ha-up.sh started: the agent, HAProxy, the replicas, the PostgreSQL nodes
# and pg_auto_failover's monitor (each by the pid file it wrote; PostgreSQL by pg_autoctl stop,
# then pg_ctl for a server left behind). Data stays in GPURENT_HA_DIR unless --purge is given.
#
#   scripts/ha-down.sh [--purge]
#
# Environment: GPURENT_HA_DIR, GPURENT_HA_PG_MAJOR as for ha-up.sh.
set -uo pipefail

DIR="${GPURENT_HA_DIR:-/var/lib/gpurent-ha}"
PG_MAJOR="${GPURENT_HA_PG_MAJOR:-15}"
PG_BIN="/usr/lib/postgresql/$PG_MAJOR/bin"
PG_USER=postgres
PURGE=0
[ "${1:-}" = "--purge" ] && PURGE=1

say() { printf 'ha-down: %s\n' "$*" >&2; }

[ -d "$DIR/run" ] || { say "nothing to stop in $DIR"; exit 0; }

as_pg() {
  setpriv --reuid="$PG_USER" --regid="$PG_USER" --init-groups \
    env HOME="$DIR/pg" PATH="$PG_BIN:$PATH" XDG_RUNTIME_DIR="$DIR/pg" "$@"
}

stop() { # NAME: TERM its session, KILL it after 20 s
  local name="$1" pid waited=0
  pid="$(cat "$DIR/run/$name.pid" 2>/dev/null)" || return 0
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    # ha-up.sh started each in a session of its own: the whole group goes.
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null
    while kill -0 "$pid" 2>/dev/null && [ "$waited" -lt 40 ]; do sleep 0.5; waited=$((waited + 1)); done
    if kill -0 "$pid" 2>/dev/null; then
      say "$name did not stop within 20 s: killing it"
      kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null
    fi
    say "stopped $name"
  fi
  rm -f "$DIR/run/$name.pid"
}

stop_pg() { # NAME: pg_autoctl's own stop, then whatever is left
  local name="$1" data="$DIR/pg/${1#pg-}"
  if [ -d "$data" ] && [ -f "$DIR/run/$name.pid" ]; then
    as_pg pg_autoctl stop --pgdata "$data" >/dev/null 2>&1 || true
  fi
  stop "$name"
  if [ -f "$data/postmaster.pid" ]; then
    local pid
    pid="$(head -1 "$data/postmaster.pid")"
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
      say "a PostgreSQL server is left in $data: stopping it"
      as_pg pg_ctl stop -D "$data" -m immediate -w -t 30 >/dev/null 2>&1 || kill -KILL "$pid"
    fi
  fi
}

stop agent
stop haproxy
for n in 1 2 3; do stop "replica-$n"; done
stop_pg pg-node2
stop_pg pg-node1
stop_pg pg-monitor

if [ "$PURGE" = 1 ]; then
  rm -rf "$DIR"
  say "removed $DIR"
else
  say "data kept in $DIR (--purge removes it)"
fi
