#!/usr/bin/env bash
# The project's single test command.
#
#   scripts/test.sh [ARGS...]
#
# Starts a throwaway PostgreSQL cluster (installing PostgreSQL with apt if it
# is missing), exports GPURENT_TEST_DATABASE_URL, runs the workspace tests
# (`cargo nextest run` when available, else `cargo test`) and then the
# doctests, then (full runs only) scripts/schemathesis.sh (the API against its OpenAPI
# document) and scripts/fuzz.sh (every fuzz target for 20 s; skipped without nightly), and
# stops the cluster again on exit, whatever happens.
# ARGS are passed to the main test runner, e.g. `scripts/test.sh -E 'test(foo)'`
# with nextest or `scripts/test.sh foo` with cargo test. When ARGS are given
# the doctest, schemathesis and fuzz passes are skipped (a targeted run).
#
# Environment:
#   GPURENT_TEST_DATABASE_URL  use this database; no local cluster is started.
#   GPURENT_TEST_PG_PORT       first port to try (default 55432); the next few
#                              are tried if it is taken.
#   GPURENT_TEST_PG_TIMEOUT    seconds to wait for the server (default 60).
#   GPURENT_TEST_ONLY_DB=1     debugging aid: start the cluster, run a smoke
#                              query (select version(), create/drop a
#                              database) with psql and exit without running
#                              cargo.
#   GPURENT_TEST_NETNS         1 when this machine can make network namespaces (root
#                              and iproute2, installed when missing): the partition test
#                              then must run; else it is skipped. Set 0 to skip it.
#   GPURENT_TEST_ISOLATION=0   skip the process executor's isolation tests even as root
#                              (a root without namespaces); as root they must run
#                              otherwise (bubblewrap, and passt for the instances'
#                              own networks, are installed when missing), not
#                              root they are skipped.
#   GPURENT_TEST_SKIP_PROMTOOL=1  do not install promtool; the metrics test then
#                              skips its promtool checks instead of failing.
#   OpenSSH's client (ssh-keygen, ssh) is installed with apt when missing.
#   GPURENT_TEST_DOCKER=1      (the default) make sure a Docker daemon is running
#                              and the test image exists; 0 skips the Docker tests.
#   GPURENT_TEST_BROWSER=1     (the default) install Chromium and chromedriver when
#                              missing: the web console's tests then must run in it;
#                              0 skips the browser tests (a quicker targeted run).
#   GPURENT_TEST_DEBIAN_ROOT=0 skip the package test (as root it installs the .deb of
#                              scripts/package.sh into a fresh Debian root made with
#                              debootstrap, cached in ~/.cache/gpurent-test/, and boots it
#                              with systemd-nspawn); debootstrap, systemd-container,
#                              binutils and cargo-deb are installed when missing.
#   GPURENT_TEST_UPGRADE=0     skip the upgrade tests; else scripts/previous-release.sh
#                              builds the previous release once (cached) and
#                              GPURENT_TEST_PREVIOUS_BIN names it (set it to use another).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

say() { printf 'test.sh: %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }

is_root() { [ "$(id -u)" -eq 0 ]; }

# Run a command as root (directly, or via sudo when we are not root).
as_root() {
  if is_root; then
    "$@"
  elif command -v sudo >/dev/null 2>&1; then
    sudo "$@"
  else
    die "need root to run: $*"
  fi
}

apt_install() {
  command -v apt-get >/dev/null 2>&1 || die "apt-get not found; install $* by hand"
  say "installing $* with apt-get"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get update -q >&2
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@" >&2
}

# ---------------------------------------------------------------------------
# PostgreSQL
# ---------------------------------------------------------------------------

PG_BIN=""        # directory holding initdb, pg_ctl, pg_isready (and usually psql)
PG_USER=""       # OS user the server runs as ("" = the current user)
PG_BASE=""       # target/test-pg (or a temp dir, see start_postgres)
PG_BASE_TMP=""   # set when PG_BASE is a temp dir to delete on exit
PG_SOCK_TMP=""   # set when the socket dir is a temp dir to delete on exit
PGDATA_DIR=""
PG_STARTED=0

find_pg_bin() {
  local dir
  # Debian/Ubuntu layout; highest major version first.
  while IFS= read -r dir; do
    if [ -x "$dir/initdb" ] && [ -x "$dir/pg_ctl" ]; then
      PG_BIN="$dir"
      return 0
    fi
  done < <(printf '%s\n' /usr/lib/postgresql/*/bin | sort -V -r)
  # Anything else on PATH (resolve symlinks so psql/pg_isready sit beside it).
  if command -v initdb >/dev/null 2>&1 && command -v pg_ctl >/dev/null 2>&1; then
    PG_BIN="$(dirname "$(readlink -f "$(command -v pg_ctl)")")"
    return 0
  fi
  return 1
}

ensure_postgres() {
  if find_pg_bin; then
    return 0
  fi
  say "PostgreSQL server binaries not found"
  apt_install postgresql
  find_pg_bin || die "PostgreSQL is installed but initdb/pg_ctl are still not found"
}

# The PostgreSQL tool NAME: from PG_BIN if there, else from PATH.
pg_tool() {
  if [ -n "$PG_BIN" ] && [ -x "$PG_BIN/$1" ]; then
    echo "$PG_BIN/$1"
  elif command -v "$1" >/dev/null 2>&1; then
    command -v "$1"
  else
    die "$1 not found"
  fi
}

# Run a command as the server's OS user, from / (its cwd may be unreadable).
as_pg() {
  if [ -n "$PG_USER" ]; then
    (cd / && runuser -u "$PG_USER" -- "$@")
  else
    "$@"
  fi
}

# postgres refuses to run as root: pick (or create) an unprivileged user.
choose_pg_user() {
  is_root || return 0
  if getent passwd postgres >/dev/null 2>&1; then
    PG_USER=postgres
  else
    PG_USER=gpurent-pg
    if ! getent passwd "$PG_USER" >/dev/null 2>&1; then
      say "creating system user $PG_USER to run PostgreSQL"
      useradd --system --user-group --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin "$PG_USER"
    fi
  fi
  command -v runuser >/dev/null 2>&1 || die "runuser not found (util-linux)"
}

port_in_use() {
  (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

print_server_log() {
  if [ -n "$PG_BASE" ] && [ -f "$PG_BASE/server.log" ]; then
    say "---- PostgreSQL server log ($PG_BASE/server.log) ----"
    cat "$PG_BASE/server.log" >&2 || true
    say "---- end of server log ----"
  fi
}

# shellcheck disable=SC2317  # called from the EXIT trap
stop_postgres() {
  [ "$PG_STARTED" = 1 ] || return 0
  PG_STARTED=0
  say "stopping PostgreSQL"
  if ! as_pg "$(pg_tool pg_ctl)" stop -D "$PGDATA_DIR" -m fast -w -t 30 >/dev/null 2>&1; then
    say "fast shutdown failed; trying immediate shutdown"
    as_pg "$(pg_tool pg_ctl)" stop -D "$PGDATA_DIR" -m immediate -w -t 30 >/dev/null 2>&1 || true
  fi
}

start_postgres() {
  ensure_postgres
  choose_pg_user
  local pg_ctl initdb pg_isready
  pg_ctl="$(pg_tool pg_ctl)"
  initdb="$(pg_tool initdb)"
  pg_isready="$(pg_tool pg_isready)"
  say "using PostgreSQL from $PG_BIN ($("$pg_ctl" --version))${PG_USER:+, running as user $PG_USER}"

  PG_BASE="$ROOT/target/test-pg"
  # A previous run killed hard may have left its server running: stop it
  # before wiping its data dir.
  local old
  old="$(readlink -f "$PG_BASE" 2>/dev/null || true)"
  if [ -n "$old" ] && [ -f "$old/data/postmaster.pid" ]; then
    say "stopping a leftover server in $PG_BASE"
    as_pg "$pg_ctl" stop -D "$old/data" -m immediate -w -t 30 >/dev/null 2>&1 || true
  fi
  case "$old" in /tmp/gpurent-test-pg.*) rm -rf "$old" ;; esac
  rm -rf "$PG_BASE"
  mkdir -p "$PG_BASE"
  if [ -n "$PG_USER" ]; then
    chown "$PG_USER:" "$PG_BASE"
    if ! as_pg test -w "$PG_BASE"; then
      # e.g. the checkout lives under /root: the server user cannot reach it.
      rmdir "$PG_BASE"
      PG_BASE="$(mktemp -d /tmp/gpurent-test-pg.XXXXXX)"
      PG_BASE_TMP="$PG_BASE"
      chown "$PG_USER:" "$PG_BASE"
      ln -s "$PG_BASE" "$ROOT/target/test-pg"
      say "$ROOT/target is not reachable by $PG_USER; using $PG_BASE instead"
    fi
  fi
  PGDATA_DIR="$PG_BASE/data"

  say "initdb in $PGDATA_DIR"
  if ! as_pg "$initdb" -D "$PGDATA_DIR" -U gpurent --auth=trust \
    --encoding=UTF8 --locale=C --no-sync >"$PG_BASE/initdb.log" 2>&1; then
    cat "$PG_BASE/initdb.log" >&2 || true
    die "initdb failed"
  fi

  local port="${GPURENT_TEST_PG_PORT:-55432}" last sock timeout
  last=$((port + 9))
  timeout="${GPURENT_TEST_PG_TIMEOUT:-60}"
  # Unix socket paths are limited to ~107 bytes.
  sock="$PGDATA_DIR"
  if [ $((${#sock} + 20)) -gt 100 ]; then
    PG_SOCK_TMP="$(mktemp -d /tmp/gpurent-pg-sock.XXXXXX)"
    [ -z "$PG_USER" ] || chown "$PG_USER:" "$PG_SOCK_TMP"
    sock="$PG_SOCK_TMP"
  fi
  cat >>"$PGDATA_DIR/postgresql.conf" <<EOF

# --- added by scripts/test.sh (throwaway test cluster) ---
listen_addresses = '127.0.0.1'
unix_socket_directories = '$sock'
max_connections = 300
fsync = off
synchronous_commit = off
full_page_writes = off
EOF

  while :; do
    if [ "$port" -gt "$last" ]; then
      die "no free port in ${GPURENT_TEST_PG_PORT:-55432}..$last"
    fi
    if port_in_use "$port"; then
      say "port $port is taken, trying $((port + 1))"
      port=$((port + 1))
      continue
    fi
    say "starting PostgreSQL on 127.0.0.1:$port"
    : >"$PG_BASE/server.log"
    [ -z "$PG_USER" ] || chown "$PG_USER:" "$PG_BASE/server.log"
    PG_STARTED=1 # from here on the EXIT trap stops the server
    if as_pg "$pg_ctl" start -D "$PGDATA_DIR" -l "$PG_BASE/server.log" \
      -o "-p $port" -w -t "$timeout" >/dev/null 2>&1; then
      break
    fi
    if grep -qiE 'could not (bind|create listen)|address already in use' "$PG_BASE/server.log"; then
      as_pg "$pg_ctl" stop -D "$PGDATA_DIR" -m immediate >/dev/null 2>&1 || true
      PG_STARTED=0
      say "port $port is taken, trying $((port + 1))"
      port=$((port + 1))
      continue
    fi
    print_server_log
    die "PostgreSQL did not start within ${timeout}s"
  done

  local waited=0
  until "$pg_isready" -q -h 127.0.0.1 -p "$port" -U gpurent -d postgres; do
    if [ "$waited" -ge "$timeout" ]; then
      print_server_log
      die "PostgreSQL on 127.0.0.1:$port did not answer pg_isready within ${timeout}s"
    fi
    sleep 1
    waited=$((waited + 1))
  done

  export GPURENT_TEST_DATABASE_URL="postgres://gpurent@127.0.0.1:$port/postgres"
  say "PostgreSQL is ready: GPURENT_TEST_DATABASE_URL=$GPURENT_TEST_DATABASE_URL"
}

# ---------------------------------------------------------------------------
# Docker (not used by default; needed by a later issue). Enable with
# GPURENT_TEST_DOCKER=1.
# ---------------------------------------------------------------------------

DOCKERD_PID=""

ensure_docker() {
  if ! command -v dockerd >/dev/null 2>&1; then
    apt_install docker.io
  fi
  if docker info >/dev/null 2>&1; then
    say "docker daemon is running"
    return 0
  fi
  mkdir -p "$ROOT/target"
  say "starting dockerd (log: target/dockerd.log)"
  local -a dockerd=(dockerd)
  is_root || dockerd=(sudo dockerd)
  "${dockerd[@]}" >"$ROOT/target/dockerd.log" 2>&1 &
  DOCKERD_PID=$!
  local waited=0 timeout="${GPURENT_TEST_DOCKER_TIMEOUT:-60}"
  until docker info >/dev/null 2>&1; do
    if ! kill -0 "$DOCKERD_PID" 2>/dev/null || [ "$waited" -ge "$timeout" ]; then
      tail -n 50 "$ROOT/target/dockerd.log" >&2 || true
      die "dockerd did not come up within ${timeout}s"
    fi
    sleep 1
    waited=$((waited + 1))
  done
  say "docker daemon is ready"
}

# The tests' image: no registry is reachable, so a rootfs of Debian's busybox-static is
# imported as gpurent-test/busybox:latest.
ensure_test_image() {
  if docker image inspect gpurent-test/busybox:latest >/dev/null 2>&1; then
    return 0
  fi
  [ -x /bin/busybox ] || apt_install busybox-static
  local rootfs
  rootfs="$(mktemp -d)"
  mkdir -p "$rootfs/bin" "$rootfs/tmp"
  cp /bin/busybox "$rootfs/bin/busybox"
  local applet
  for applet in sh sleep echo cat ls true false env id; do
    ln -s busybox "$rootfs/bin/$applet"
  done
  tar -C "$rootfs" -c . | docker import - gpurent-test/busybox:latest >/dev/null
  rm -rf "$rootfs"
  say "imported the test image gpurent-test/busybox:latest"
}

# shellcheck disable=SC2317  # called from the EXIT trap
stop_docker() {
  [ -n "$DOCKERD_PID" ] || return 0
  say "stopping dockerd"
  kill "$DOCKERD_PID" 2>/dev/null || true
  local _
  for _ in $(seq 1 30); do
    kill -0 "$DOCKERD_PID" 2>/dev/null || break
    sleep 1
  done
  DOCKERD_PID=""
}

# ---------------------------------------------------------------------------
# The process executor's sandbox (bubblewrap): as root, its isolation tests must run
# ---------------------------------------------------------------------------

ensure_bwrap() {
  if ! is_root || [ "${GPURENT_TEST_ISOLATION:-1}" = 0 ]; then
    say "not root or GPURENT_TEST_ISOLATION=0: the process executor's isolation tests will be skipped"
    return 0
  fi
  [ -x /usr/bin/bwrap ] || [ -x /bin/bwrap ] || apt_install bubblewrap
  # Each instance's own network namespace is attached to the node's network by pasta.
  [ -x /usr/bin/pasta ] || [ -x /bin/pasta ] || apt_install passt
}

# ---------------------------------------------------------------------------
# Network namespaces (the partition test cuts a real link)
# ---------------------------------------------------------------------------

probe_netns() {
  if [ -n "${GPURENT_TEST_NETNS:-}" ]; then
    return 0
  fi
  if ! is_root; then
    say "not root: the network-namespace partition test will be skipped"
    return 0
  fi
  command -v ip >/dev/null 2>&1 || (apt_install iproute2) || true
  local probe="gpurent-probe-$$"
  if ip netns add "$probe" 2>/dev/null; then
    ip netns del "$probe"
    export GPURENT_TEST_NETNS=1
  else
    say "cannot make network namespaces here: the partition test will be skipped"
  fi
}

# ---------------------------------------------------------------------------
# promtool (Debian's `prometheus` package): the metrics test checks the /metrics
# output and the shipped alert rules with it.
# ---------------------------------------------------------------------------

ensure_promtool() {
  command -v promtool >/dev/null 2>&1 && return 0
  apt_install prometheus
  command -v promtool >/dev/null 2>&1 || die "prometheus is installed but promtool is not on PATH"
}

# ---------------------------------------------------------------------------
# OpenSSH's client tools: the SSH tests make keys with ssh-keygen and connect with ssh, scp
# and sftp.
# ---------------------------------------------------------------------------

ensure_openssh_client() {
  command -v ssh-keygen >/dev/null 2>&1 && command -v ssh >/dev/null 2>&1 && return 0
  apt_install openssh-client
}

# sshd, for the tests of gpurent's own SSH client (`gpurent cp`, `port-forward`) against
# OpenSSH's server on loopback; the tests start it themselves, so the service stays off.
ensure_openssh_server() {
  [ -x /usr/sbin/sshd ] && return 0
  apt_install openssh-server
}

# ---------------------------------------------------------------------------
# Chromium and chromedriver (Debian's packages): the web console's tests drive a real headless
# browser over WebDriver.
# ---------------------------------------------------------------------------

# A Chinese font too, or the zh-CN screenshots show boxes for every character.
CJK_FONT=/usr/share/fonts/truetype/wqy/wqy-microhei.ttc

ensure_chromium() {
  local -a missing=()
  [ -x /usr/bin/chromium ] || missing+=(chromium)
  [ -x /usr/bin/chromedriver ] || missing+=(chromium-driver)
  [ -f "$CJK_FONT" ] || missing+=(fonts-wqy-microhei)
  [ "${#missing[@]}" -eq 0 ] && return 0
  apt_install "${missing[@]}"
  [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ] ||
    die "chromium and chromium-driver are installed but /usr/bin/chromium or /usr/bin/chromedriver is missing"
}

# ---------------------------------------------------------------------------
# The package test: cargo-deb makes the .deb (scripts/package.sh; objcopy from binutils splits
# out the debug info), debootstrap a fresh Debian root to install it in, systemd-nspawn
# (systemd-container) boots that root.
# ---------------------------------------------------------------------------

ensure_packaging() {
  if ! is_root || [ "${GPURENT_TEST_DEBIAN_ROOT:-1}" = 0 ]; then
    say "not root or GPURENT_TEST_DEBIAN_ROOT=0: the package test will be skipped"
    return 0
  fi
  local -a missing=()
  [ -x /usr/sbin/debootstrap ] || missing+=(debootstrap)
  command -v systemd-nspawn >/dev/null 2>&1 || missing+=(systemd-container)
  command -v objcopy >/dev/null 2>&1 || missing+=(binutils)
  command -v flock >/dev/null 2>&1 || missing+=(util-linux)
  [ "${#missing[@]}" -eq 0 ] || apt_install "${missing[@]}"
  if ! command -v cargo-deb >/dev/null 2>&1; then
    say "installing cargo-deb with cargo install (once; a minute or two)"
    cargo install cargo-deb --version 3.8.0 --locked --quiet >&2 || die "cargo install cargo-deb failed"
  fi
}

# The previous release's binary, for the upgrade tests: built once, cached by commit.
ensure_previous_release() {
  [ "${GPURENT_TEST_UPGRADE:-1}" != 0 ] || { say "GPURENT_TEST_UPGRADE=0: the upgrade tests will be skipped"; return; }
  [ -z "${GPURENT_TEST_PREVIOUS_BIN:-}" ] || { export GPURENT_TEST_PREVIOUS_BIN; return; }
  local bin rc=0
  bin="$("$ROOT/scripts/previous-release.sh")" || rc=$?
  case "$rc" in
    0) export GPURENT_TEST_PREVIOUS_BIN="$bin" ;;
    2) say "no previous release in this clone: the upgrade tests will be skipped" ;;
    *) die "building the previous release failed (scripts/previous-release.sh, exit $rc)" ;;
  esac
}

# ---------------------------------------------------------------------------

# shellcheck disable=SC2317  # the EXIT trap
cleanup() {
  local rc=$?
  set +e
  stop_postgres
  [ -z "$PG_SOCK_TMP" ] || rm -rf "$PG_SOCK_TMP"
  if [ -n "$PG_BASE_TMP" ]; then
    rm -rf "$PG_BASE_TMP"
    rm -f "$ROOT/target/test-pg"
  fi
  stop_docker
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

probe_netns
ensure_bwrap
ensure_openssh_client
ensure_openssh_server
ensure_packaging
ensure_previous_release
if [ "${GPURENT_TEST_SKIP_PROMTOOL:-0}" != 1 ]; then
  ensure_promtool
fi

export GPURENT_TEST_BROWSER="${GPURENT_TEST_BROWSER:-1}"
if [ "$GPURENT_TEST_BROWSER" = 1 ]; then
  ensure_chromium
fi

export GPURENT_TEST_DOCKER="${GPURENT_TEST_DOCKER:-1}"
if [ "$GPURENT_TEST_DOCKER" = 1 ]; then
  ensure_docker
  ensure_test_image
  # The image pull tests start their own registry from Debian's package.
  command -v docker-registry >/dev/null 2>&1 || apt_install docker-registry
  # A container's disk bounded by the Engine: the test runs an Engine of its own on a btrfs.
  if is_root && grep -qw btrfs /proc/filesystems; then
    command -v mkfs.btrfs >/dev/null 2>&1 || apt_install btrfs-progs
  fi
fi

if [ -n "${GPURENT_TEST_DATABASE_URL:-}" ]; then
  say "using GPURENT_TEST_DATABASE_URL from the environment; not starting PostgreSQL"
  export GPURENT_TEST_DATABASE_URL
else
  start_postgres
fi

if [ "${GPURENT_TEST_ONLY_DB:-0}" = 1 ]; then
  psql="$(pg_tool psql)"
  db="gpurent_smoke_$$"
  say "GPURENT_TEST_ONLY_DB=1: smoke test with psql, not running cargo"
  "$psql" "$GPURENT_TEST_DATABASE_URL" -X -v ON_ERROR_STOP=1 \
    -c 'select version()' -c "CREATE DATABASE $db" -c "DROP DATABASE $db" ||
    die "database smoke test failed"
  say "database smoke test passed"
  exit 0
fi

# `-p CRATE` narrows the run to that crate; without it, the whole workspace.
scope=(--workspace)
for arg in "$@"; do
  case "$arg" in -p | --package | -p* | --package=*) scope=() ;; esac
done

status=0
if cargo nextest --version >/dev/null 2>&1; then
  # A workspace without tests yet should not fail the run.
  [ "$#" -gt 0 ] || export NEXTEST_NO_TESTS="${NEXTEST_NO_TESTS:-warn}"
  say "running: cargo nextest run ${scope[*]} --no-fail-fast $*"
  cargo nextest run "${scope[@]}" --no-fail-fast "$@" || status=$?
else
  say "cargo-nextest not found; running: cargo test ${scope[*]} $*"
  cargo test "${scope[@]}" "$@" || status=$?
fi

if [ "$#" -gt 0 ]; then
  say "extra arguments given: skipping doctests"
else
  say "running: cargo test --workspace --doc"
  cargo test --workspace --doc || status=$?
fi

if [ "$#" -eq 0 ]; then
  # The API against its own OpenAPI document, then the parsers under libFuzzer (skipped
  # without a nightly toolchain). Full runs only.
  say "running: scripts/schemathesis.sh"
  "$ROOT/scripts/schemathesis.sh" || status=$?
  say "running: scripts/fuzz.sh"
  "$ROOT/scripts/fuzz.sh" || status=$?
fi

if [ "$status" -ne 0 ]; then
  say "FAILED (exit $status)"
else
  say "all tests passed"
fi
exit "$status"
