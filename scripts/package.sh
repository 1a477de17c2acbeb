#!/usr/bin/env bash
# Builds gpurent's Debian packages with cargo-deb.
#
#   scripts/package.sh [--profile release|dev] [--no-build] [--out DIR]
#
# Makes two packages and prints their paths, one a line (and nothing else on stdout):
#   gpurent_VERSION_ARCH.deb         the stripped binary in /usr/bin, the systemd units
#                                    (deploy/systemd/), the example configuration in
#                                    /etc/gpurent/ (deploy/config/, conffiles)
#   gpurent-dbgsym_VERSION_ARCH.deb  the binary's debug info, /usr/lib/debug/.build-id/*.debug
# What goes in them is `[package.metadata.deb]` in crates/gpurent/Cargo.toml.
#
#   --profile release  (the default) builds the release binary unless --no-build; xz at
#                      cargo-deb's usual level. Packages go to target/debian/.
#   --profile dev      packages the debug build (target/debug/gpurent), compressed fast: for
#                      the tests, which already built it (`--profile dev --no-build` takes
#                      seconds). Packages go to target/debian/dev/.
#   --no-build         package the binary already built for the profile.
#   --out DIR          write the packages to DIR instead.
#
# Needs cargo-deb (`cargo install cargo-deb --locked`; scripts/test.sh installs it) and GNU
# objcopy (binutils) for the debug info.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

say() { printf 'package.sh: %s\n' "$*" >&2; }
die() {
  say "error: $*"
  exit 1
}

profile=release
build=1
out=""
while [ "$#" -gt 0 ]; do
  case "$1" in
    --profile)
      [ "$#" -ge 2 ] || die "--profile needs release or dev"
      profile="$2"
      shift 2
      ;;
    --profile=*)
      profile="${1#--profile=}"
      shift
      ;;
    --no-build)
      build=0
      shift
      ;;
    --out)
      [ "$#" -ge 2 ] || die "--out needs a directory"
      out="$2"
      shift 2
      ;;
    --out=*)
      out="${1#--out=}"
      shift
      ;;
    -h | --help)
      sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'
      exit 0
      ;;
    *) die "unknown argument: $1 (see --help)" ;;
  esac
done

target_dir="${CARGO_TARGET_DIR:-$ROOT/target}"
declare -a flags=(-p gpurent --dbgsym --quiet)
case "$profile" in
  release)
    binary="$target_dir/release/gpurent"
    out="${out:-$target_dir/debian}"
    ;;
  dev | debug)
    profile=dev
    binary="$target_dir/debug/gpurent"
    out="${out:-$target_dir/debian/dev}"
    # cargo-deb is meant for releases and warns about the dev profile; the tests package the
    # build they already have rather than build a second, release binary.
    flags+=(--profile dev --fast)
    ;;
  *) die "unknown profile: $profile (release or dev)" ;;
esac

command -v cargo-deb >/dev/null 2>&1 || die "cargo-deb not found: cargo install cargo-deb --locked"
command -v objcopy >/dev/null 2>&1 || die "objcopy not found: apt-get install binutils"

if [ "$build" = 0 ]; then
  [ -x "$binary" ] || die "--no-build, but $binary is not built (cargo build$([ "$profile" = dev ] || echo ' --release') -p gpurent)"
  flags+=(--no-build)
else
  say "building the $profile binary"
fi

mkdir -p "$out"
name="$(sed -n 's/^name = "\(.*\)"$/\1/p' crates/gpurent/Cargo.toml | head -n1)"
# Only this run's packages are printed: older ones of the same name are replaced.
rm -f "$out/${name}"_*.deb "$out/${name}"-dbgsym_*.deb "$out/${name}"-dbgsym_*.ddeb

log="$(mktemp)"
trap 'rm -f "$log"' EXIT
# cargo-deb prints the packages' paths on stdout; its warnings (the dev profile's) go to stderr.
if ! cargo deb "${flags[@]}" --output "$out" >"$log" 2>&2; then
  cat "$log" >&2
  die "cargo deb failed"
fi

found=0
while IFS= read -r path; do
  [ -f "$path" ] || continue
  case "$path" in
    *.ddeb)
      # Debian names its dbgsym packages .deb (the .ddeb of Ubuntu's archive); apt installs
      # a local file only by that name.
      mv -f "$path" "${path%.ddeb}.deb"
      path="${path%.ddeb}.deb"
      ;;
  esac
  printf '%s\n' "$path"
  found=$((found + 1))
done <"$log"
[ "$found" -eq 2 ] || {
  cat "$log" >&2
  die "expected 2 packages from cargo deb, found $found"
}
