#!/usr/bin/env bash
# The web console's vendored browser packages (xterm.js and its fit addon), locked in
# crates/server/assets/vendor/vendor.lock and committed, so a build needs no Node and no
# network; this script is only for updating them or proving they are what the registry holds.
#
#   scripts/vendor-assets.sh --check    re-fetch each locked tarball, check its integrity
#                                       (the registry's sha512) and that every committed file
#                                       is byte for byte the tarball's (network needed)
#   scripts/vendor-assets.sh --update   re-fetch, check the integrity, and rewrite the files
#                                       and their sha256 in the lock
#
# vendor.lock, one record a line ('#' starts a comment):
#   package NAME VERSION TARBALL_PATH SHA512_INTEGRITY
#   file    NAME PATH_IN_TARBALL VENDORED_NAME SHA256
# TARBALL_PATH is the tarball's path on the registry, without the host. To move to another
# version: edit the package line (version, path and integrity, from `npm view NAME@VERSION
# dist`), run --update, and commit the files and the lock.
#
# Environment:
#   NPM_REGISTRY   the registry's base URL (default: `npm config get registry`).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
vendor="$root/crates/server/assets/vendor"
lock="$vendor/vendor.lock"

mode="${1:-}"
case "$mode" in
--check | --update) ;;
*)
    echo "usage: $0 --check | --update" >&2
    exit 2
    ;;
esac

registry="${NPM_REGISTRY:-}"
if [[ -z "$registry" ]]; then
    if ! command -v npm >/dev/null; then
        echo "$0: set NPM_REGISTRY to the npm registry's base URL (npm is not installed to ask)" >&2
        exit 2
    fi
    registry="$(npm config get registry)"
fi
registry="${registry%/}"

for tool in curl tar openssl sha256sum; do
    command -v "$tool" >/dev/null || {
        echo "$0: $tool is needed" >&2
        exit 2
    }
done

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# Fetch every locked package and check it against the registry's integrity.
declare -A tarball
while read -r kind name version path integrity _; do
    [[ "$kind" == package ]] || continue
    file="$work/$(echo "$name" | tr '/@' '__').tgz"
    curl --fail --silent --show-error --location --retry 3 -o "$file" "$registry$path"
    got="sha512-$(openssl dgst -sha512 -binary "$file" | openssl base64 -A)"
    if [[ "$got" != "$integrity" ]]; then
        echo "$0: $name $version: the tarball's integrity is $got, the lock says $integrity" >&2
        exit 1
    fi
    tarball[$name]="$file"
    echo "$name $version: integrity ok"
done < <(grep -v '^[[:space:]]*#' "$lock")

failed=0
new_lock="$work/vendor.lock"
: >"$new_lock"
while IFS= read -r line; do
    read -r kind name inner vendored sha _ <<<"$line" || true
    if [[ "$kind" != file ]]; then
        printf '%s\n' "$line" >>"$new_lock"
        continue
    fi
    src="${tarball[$name]:-}"
    if [[ -z "$src" ]]; then
        echo "$0: file $vendored: no package line for $name" >&2
        exit 1
    fi
    extracted="$work/extracted"
    tar -xzf "$src" -O "$inner" >"$extracted"
    want="$(sha256sum "$extracted" | cut -d' ' -f1)"
    if [[ "$mode" == --update ]]; then
        cp "$extracted" "$vendor/$vendored"
        printf 'file %s %s %s %s\n' "$name" "$inner" "$vendored" "$want" >>"$new_lock"
        echo "$vendored: written from $name $inner"
        continue
    fi
    printf '%s\n' "$line" >>"$new_lock"
    if ! cmp -s "$extracted" "$vendor/$vendored"; then
        echo "$0: $vendored differs from $inner in $name's tarball" >&2
        failed=1
    elif [[ "$sha" != "$want" ]]; then
        echo "$0: $vendored: the lock says sha256 $sha, the tarball's file has $want" >&2
        failed=1
    else
        echo "$vendored: same as $name $inner"
    fi
done <"$lock"

if [[ "$mode" == --update ]]; then
    cp "$new_lock" "$lock"
    echo "updated $lock"
fi
exit "$failed"
