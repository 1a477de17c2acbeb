#!/usr/bin/env bash
# The HA stack on one machine, on loopback ports: HAProxy in front of three `gpurent server`
# replicas (health-checked on /readyz), and PostgreSQL with a synchronous standby and automatic
# failover by pg_auto_failover (a monitor, a primary, a secondary). Everything comes from
# Debian's packages, installed with apt-get when missing. Needs root; no systemd (the daemons
# are started directly). Idempotent: what runs already is left running. scripts/ha-down.sh
# stops everything it started.
#
#   scripts/ha-up.sh
#
# Environment:
#   GPURENT_HA_DIR        state, logs and pid files (default /var/lib/gpurent-ha)
#   GPURENT_HA_PORT       HAProxy's port (default 18080); the replicas take the next three,
#                         HAProxy's stats page (/stats, /metrics) the one after
#   GPURENT_HA_PG_PORT    pg_auto_failover's monitor (default 15440); the two PostgreSQL
#                         nodes take the next two
#   GPURENT_HA_PG_MAJOR   PostgreSQL's major version (default 15, Debian 12's)
#   GPURENT_HA_MISSED_HEARTBEATS
#                         heartbeats (of 2 s) a node may miss before the replicas fence it
#                         (default 10: a node TTL of 20 s, its agent's lease 19 s, longer than
#                         a database failover, which would otherwise stop and reschedule every
#                         node's work; a lost node's work then moves after 20 s, not 6 s)
#   GPURENT_HA_REPLICA_DB_URL_1, _2, _3
#                         the database URL of one replica (default: both PostgreSQL nodes,
#                         read-write; `gpurent bench chaos` routes each through a proxy of its
#                         own to cut one replica from the database)
#   GPURENT_HA_SIM_AGENT  also start one agent with these simulated GPUs (e.g. 4xRTX4090, the
#                         sim executor: nothing runs), joined through HAProxy (default: none)
#   GPURENT_BIN           the gpurent binary (default: gpurent on PATH, else this checkout's
#                         target/release or target/debug build)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${GPURENT_HA_DIR:-/var/lib/gpurent-ha}"
PORT="${GPURENT_HA_PORT:-18080}"
PG_PORT="${GPURENT_HA_PG_PORT:-15440}"
PG_MAJOR="${GPURENT_HA_PG_MAJOR:-15}"
SIM_AGENT="${GPURENT_HA_SIM_AGENT:-}"
MISSED="${GPURENT_HA_MISSED_HEARTBEATS:-10}"
case "$MISSED" in ''|*[!0-9]*|0) echo "ha-up: error: GPURENT_HA_MISSED_HEARTBEATS=$MISSED: a whole number of heartbeats, at least 1" >&2; exit 1 ;; esac
PG_USER=postgres

say() { printf 'ha-up: %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }

[ "$(id -u)" -eq 0 ] || die "run as root (it installs packages and runs PostgreSQL as $PG_USER)"

# ---------------------------------------------------------------------------------------------
# Packages
# ---------------------------------------------------------------------------------------------
PG_BIN="/usr/lib/postgresql/$PG_MAJOR/bin"
missing=()
command -v haproxy >/dev/null 2>&1 || missing+=(haproxy)
[ -x "$PG_BIN/pg_ctl" ] || missing+=("postgresql-$PG_MAJOR")
command -v pg_autoctl >/dev/null 2>&1 || missing+=("postgresql-$PG_MAJOR-auto-failover" pg-auto-failover-cli)
command -v setpriv >/dev/null 2>&1 || missing+=(util-linux)
if [ "${#missing[@]}" -gt 0 ]; then
  command -v apt-get >/dev/null 2>&1 || die "apt-get not found: install ${missing[*]} by hand"
  say "installing ${missing[*]} with apt-get"
  DEBIAN_FRONTEND=noninteractive apt-get update -q >&2 || die "apt-get update failed"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >&2 \
    || die "apt-get install ${missing[*]} failed"
fi
[ -x "$PG_BIN/pg_ctl" ] || die "PostgreSQL $PG_MAJOR's binaries are not in $PG_BIN"
getent passwd "$PG_USER" >/dev/null || die "user $PG_USER missing (the postgresql package makes it)"

GPURENT="${GPURENT_BIN:-}"
if [ -z "$GPURENT" ]; then
  for candidate in "$(command -v gpurent || true)" "$ROOT/target/release/gpurent" "$ROOT/target/debug/gpurent"; do
    if [ -n "$candidate" ] && [ -x "$candidate" ]; then GPURENT="$candidate"; break; fi
  done
fi
[ -n "$GPURENT" ] && [ -x "$GPURENT" ] \
  || die "no gpurent binary: set GPURENT_BIN, put gpurent on PATH, or cargo build --release -p gpurent"

# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------
mkdir -p "$DIR"/{run,logs,shared,replicas}
chmod 0700 "$DIR/shared"
mkdir -p "$DIR/pg"
chown "$PG_USER:" "$DIR/pg"
chmod 0755 "$DIR"
LOGS="$DIR/logs"

alive() { # NAME: its pid file names a running process
  local pid
  pid="$(cat "$DIR/run/$1.pid" 2>/dev/null)" || return 1
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null
}

start() { # NAME CMD...: runs CMD in its own session, output to logs/NAME.log, pid in run/
  local name="$1"; shift
  if alive "$name"; then
    say "$name already runs (pid $(cat "$DIR/run/$name.pid"))"
    return 0
  fi
  setsid "$@" >>"$LOGS/$name.log" 2>&1 </dev/null &
  echo $! >"$DIR/run/$name.pid"
  say "started $name (pid $!, log $LOGS/$name.log)"
}

# CMD... as the PostgreSQL user, with PostgreSQL's binaries first on PATH (exec'd, so that a
# pid file names the daemon itself).
AS_PG=(setpriv --reuid="$PG_USER" --regid="$PG_USER" --init-groups
  env HOME="$DIR/pg" PATH="$PG_BIN:$PATH" XDG_RUNTIME_DIR="$DIR/pg")
as_pg() { "${AS_PG[@]}" "$@"; }

wait_for() { # WHAT SECONDS CMD...: polls CMD every 0.5 s
  local what="$1" secs="$2"; shift 2
  local deadline=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    [ "$SECONDS" -lt "$deadline" ] || die "$what did not happen within ${secs}s (logs: $LOGS)"
    sleep 0.5
  done
}

http_status() { # HOST PORT PATH: the status code of a plain HTTP GET (no curl needed)
  local status
  exec 9<>"/dev/tcp/$1/$2" || return 1
  printf 'GET %s HTTP/1.0\r\nHost: %s\r\n\r\n' "$3" "$1" >&9
  read -r _ status _ <&9 || true
  exec 9<&-
  echo "$status"
}

ready_on() { [ "$(http_status 127.0.0.1 "$1" /readyz)" = 200 ]; }

replica_ready() { # NAME PORT: ready, or dies with the log's end when NAME has exited
  if ! alive "$1"; then
    tail -5 "$LOGS/$1.log" >&2
    die "$1 exited (log: $LOGS/$1.log)"
  fi
  ready_on "$2"
}

psql_monitor() { as_pg psql -X -q -A -t -h 127.0.0.1 -p "$PG_PORT" -U autoctl_node -d pg_auto_failover -c "$1"; }

node_state() { psql_monitor "SELECT reportedstate FROM pgautofailover.node WHERE nodename = '$1'"; }

state_is() { # NODE STATE...: the monitor has NODE in one of STATEs
  local got want
  got="$(node_state "$1" 2>/dev/null)" || return 1
  shift
  for want in "$@"; do [ "$got" = "$want" ] && return 0; done
  return 1
}

# ---------------------------------------------------------------------------------------------
# PostgreSQL: the monitor, then the primary, then the synchronous secondary
# ---------------------------------------------------------------------------------------------
MONITOR_URI="postgres://autoctl_node@127.0.0.1:$PG_PORT/pg_auto_failover?sslmode=disable"
if [ -f "$DIR/pg/monitor/PG_VERSION" ]; then
  start pg-monitor "${AS_PG[@]}" pg_autoctl run --pgdata "$DIR/pg/monitor"
else
  start pg-monitor "${AS_PG[@]}" pg_autoctl create monitor --pgdata "$DIR/pg/monitor" \
    --pgport "$PG_PORT" --hostname 127.0.0.1 --auth trust --no-ssl --run
fi
wait_for "the pg_auto_failover monitor" 90 psql_monitor "SELECT 1"
# As the monitor's superuser (ALTER SYSTEM), stopping at the first error.
as_pg psql -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$PG_PORT" -U "$PG_USER" -d pg_auto_failover \
  -f "$ROOT/deploy/ha/monitor.sql" >/dev/null \
  || say "warning: could not tune the monitor's health checks (failover takes the defaults' ~60 s)"

for n in 1 2; do
  name="node$n"
  port=$((PG_PORT + n))
  if [ -f "$DIR/pg/$name/PG_VERSION" ]; then
    start "pg-$name" "${AS_PG[@]}" pg_autoctl run --pgdata "$DIR/pg/$name"
  else
    start "pg-$name" "${AS_PG[@]}" pg_autoctl create postgres --pgdata "$DIR/pg/$name" \
      --pgport "$port" --hostname 127.0.0.1 --name "$name" --dbname gpurent \
      --monitor "$MONITOR_URI" --auth trust --no-ssl --run
  fi
  # The first node must be up before the second clones it.
  if [ "$n" = 1 ]; then
    wait_for "$name to register" 120 state_is "$name" single primary wait_primary secondary catchingup
  fi
done
pair_ready() {
  [ "$(psql_monitor "SELECT string_agg(reportedstate::text, ',' ORDER BY reportedstate::text) FROM pgautofailover.node")" = "primary,secondary" ]
}
wait_for "a primary and a synchronous secondary" 180 pair_ready

DB_URL="postgres://postgres@127.0.0.1:$((PG_PORT + 1)),127.0.0.1:$((PG_PORT + 2))/gpurent?target_session_attrs=read-write"

# ---------------------------------------------------------------------------------------------
# The replicas share the master key (made here once); the keys it seals (node CA, audit
# signing key, SSH host key) are made by the first replica, in the database
# ---------------------------------------------------------------------------------------------
if [ ! -s "$DIR/shared/master.key" ]; then
  (umask 077 && od -An -tx1 -N32 /dev/urandom | tr -d ' \n' >"$DIR/shared/master.key")
  say "made the master key $DIR/shared/master.key (back it up: sealed secrets need it)"
fi
for n in 1 2 3; do
  rport=$((PORT + n))
  mkdir -p "$DIR/replicas/r$n"
  url_var="GPURENT_HA_REPLICA_DB_URL_$n"
  start "replica-$n" "$GPURENT" server \
    --data-dir "$DIR/replicas/r$n" \
    --listen "127.0.0.1:$rport" \
    --advertise-url "http://127.0.0.1:$rport" \
    --database-url "${!url_var:-$DB_URL}" \
    --missed-heartbeats "$MISSED" \
    --master-key-file "$DIR/shared/master.key" \
    --rate-limit-per-address 0
  if [ "$n" = 1 ]; then
    wait_for "replica 1 to be ready" 120 replica_ready replica-1 "$rport"
  fi
done
for n in 2 3; do wait_for "replica $n to be ready" 120 replica_ready "replica-$n" "$((PORT + n))"; done

# ---------------------------------------------------------------------------------------------
# HAProxy
# ---------------------------------------------------------------------------------------------
servers=""
for n in 1 2 3; do servers+="    server r$n 127.0.0.1:$((PORT + n)) check"$'\n'; done
sed -e "s|@BIND@|127.0.0.1:$PORT|" -e "s|@STATS_BIND@|127.0.0.1:$((PORT + 4))|" \
  -e "/@SERVERS@/{
r /dev/stdin
d
}" "$ROOT/deploy/ha/haproxy.cfg.in" <<<"$servers" >"$DIR/haproxy.cfg"
haproxy -c -q -f "$DIR/haproxy.cfg" || die "haproxy.cfg is not valid ($DIR/haproxy.cfg)"
start haproxy haproxy -db -f "$DIR/haproxy.cfg"
wait_for "HAProxy to answer" 60 replica_ready haproxy "$PORT"

URL="http://127.0.0.1:$PORT"
if [ -n "$SIM_AGENT" ]; then
  mkdir -p "$DIR/agent"
  if ! alive agent; then
    # A fresh join token each time; a node already registered ignores it.
    join="$("$GPURENT" --server "$URL" --token "$(cat "$DIR/replicas/r1/admin.token")" --json \
      nodes join-token | sed -n 's/.*"token": *"\([^"]*\)".*/\1/p')"
    [ -n "$join" ] || die "could not get a join token for the simulated agent"
    start agent "$GPURENT" --server "$URL" agent --data-dir "$DIR/agent" --name ha-sim \
      --sim-gpus "$SIM_AGENT" --executor sim --join-token "$join" --missed-heartbeats "$MISSED"
  fi
fi

cat <<EOF
gpurent HA stack is up
  URL:          $URL  (HAProxy; stats at http://127.0.0.1:$((PORT + 4))/stats)
  admin token:  $DIR/replicas/r1/admin.token
  replicas:     http://127.0.0.1:$((PORT + 1)) http://127.0.0.1:$((PORT + 2)) http://127.0.0.1:$((PORT + 3))
  database:     $DB_URL
  monitor:      $MONITOR_URI  (pg_autoctl show state --pgdata $DIR/pg/monitor)
  logs:         $LOGS
  stop with:    scripts/ha-down.sh  (GPURENT_HA_DIR=$DIR)
EOF
