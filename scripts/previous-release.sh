#!/usr/bin/env bash
# Build the previous release's `gpurent` once and print its path: what the upgrade tests
# (crates/gpurent/tests/it/upgrade.rs, the rolling upgrade in chaos.rs) and
# `gpurent bench upgrade --from` run against this tree.
#
#   scripts/previous-release.sh            # prints the binary's path on stdout
#
# The release is the tag PREVIOUS (v0.1.0 unless GPURENT_PREVIOUS_RELEASE names another);
# its source comes from this clone's git history (`git archive`), so nothing is fetched.
# The binary is cached by commit in ~/.cache/gpurent-test/releases/<commit>/gpurent; its
# build directory is removed afterwards (a first build takes some minutes on 2 cores).
# Exits 2, saying why, when the tag is not in this clone (a shallow clone, say).
set -euo pipefail

say() { printf 'previous-release.sh: %s\n' "$*" >&2; }

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TAG="${GPURENT_PREVIOUS_RELEASE:-v0.1.0}"

commit="$(git -C "$ROOT" rev-parse --verify --quiet "$TAG^{commit}" || true)"
if [ -z "$commit" ]; then
  say "the tag $TAG is not in this clone (fetch it with: git fetch origin tag $TAG)"
  exit 2
fi
cache="${XDG_CACHE_HOME:-$HOME/.cache}/gpurent-test/releases/$commit"
bin="$cache/gpurent"
if [ -x "$bin" ] && "$bin" --version >/dev/null 2>&1; then
  printf '%s\n' "$bin"
  exit 0
fi

mkdir -p "$cache"
work="$(mktemp -d "$cache/build.XXXXXX")"
trap 'rm -rf "$work"' EXIT
say "building gpurent $TAG ($commit) once into $cache (some minutes)"
git -C "$ROOT" archive --format=tar "$commit" | tar -x -C "$work/"
(
  cd "$work"
  # Its own target directory: the binary must not replace this tree's target/debug/gpurent.
  CARGO_TARGET_DIR="$work/target" cargo build --locked --quiet -p gpurent --bin gpurent >&2
)
install -m 0755 "$work/target/debug/gpurent" "$bin.tmp"
mv "$bin.tmp" "$bin"
say "built $("$bin" --version)"
printf '%s\n' "$bin"
