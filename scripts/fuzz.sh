#!/usr/bin/env bash
# Runs every cargo-fuzz target for a bounded time.
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]
#
# SECONDS per target (default 20; env GPURENT_FUZZ_SECONDS). Without TARGETs, all of
# `cargo fuzz list`. Needs a nightly toolchain (`cargo +nightly`): where there is none it says
# so and exits 0, so machines without nightly still pass. Installs cargo-fuzz when missing.
# Fails (exit 1) when a target crashes: the input is left in fuzz/artifacts/TARGET/ and
#   cargo +nightly fuzz run TARGET fuzz/artifacts/TARGET/crash-...
# replays it. The corpus grows in fuzz/corpus/TARGET (ignored by git), seeded from
# fuzz/seeds/TARGET (committed).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

say() { printf 'fuzz.sh: %s\n' "$*" >&2; }

seconds="${1:-${GPURENT_FUZZ_SECONDS:-20}}"
[ "$#" -eq 0 ] || shift
case "$seconds" in '' | *[!0-9]*) say "error: SECONDS must be a number, not $seconds"; exit 2 ;; esac

if ! cargo +nightly --version >/dev/null 2>&1; then
  say "SKIPPED: no nightly Rust toolchain here (cargo-fuzz needs one: rustup toolchain install nightly)"
  exit 0
fi

if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
  say "installing cargo-fuzz"
  cargo install cargo-fuzz --locked >&2
fi

# The fuzz crate's own target dir (fuzz/target), whatever the environment says for the
# main workspace: its sanitizer builds do not mix with ordinary ones.
unset CARGO_TARGET_DIR

cd fuzz
if [ "$#" -gt 0 ]; then
  targets=("$@")
else
  mapfile -t targets < <(cargo +nightly fuzz list)
fi

say "building ${#targets[@]} targets"
cargo +nightly fuzz build >&2

failed=()
for t in "${targets[@]}"; do
  mkdir -p "corpus/$t"
  seeds=()
  [ -d "seeds/$t" ] && seeds=("seeds/$t")
  say "running $t for ${seconds}s"
  log="$(mktemp)"
  if cargo +nightly fuzz run "$t" "corpus/$t" "${seeds[@]}" -- \
    -max_total_time="$seconds" -print_final_stats=1 -max_len=65536 >"$log" 2>&1; then
    execs="$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || true)"
    rate="$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$log" | grep -o '[0-9]*$' || true)"
    say "$t: ok, ${execs:-?} executions, ${rate:-?}/s"
  else
    tail -n 60 "$log" >&2
    say "$t: CRASHED; the input is in fuzz/artifacts/$t/ (replay: cargo +nightly fuzz run $t fuzz/artifacts/$t/crash-...)"
    failed+=("$t")
  fi
  rm -f "$log"
done

if [ "${#failed[@]}" -gt 0 ]; then
  say "FAILED: ${failed[*]}"
  exit 1
fi
say "all ${#targets[@]} targets ran ${seconds}s without a crash"
