#!/usr/bin/env bash
# Read and write throughput of a volume inside an instance against the same disk outside it,
# with a real `gpurent up` as root (isolated processes; and containers where a Docker Engine
# answers and the test image gpurent-test/busybox is there):
#
#   scripts/bench_volume_io.sh [MIB] [--json]
#
# Each figure is dd of MIB MiB (default 1024) in 1 MiB blocks: a write ended by fsync, then,
# after the host drops its page cache, a read. Outside: a file in the agent's volumes dir (the
# disk the volumes' images are on). Inside: a file in a volume mounted at /v, written by one
# reservation and read by the next. Prints one row per place (MiB/s and the share of the
# outside figure); with --json, one JSON document.
set -euo pipefail

mib=1024
json=0
for a in "$@"; do
  case "$a" in
    --json) json=1 ;;
    *) mib=$a ;;
  esac
done
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
gpurent=${GPURENT:-$root/target/release/gpurent}
dir=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  for f in "$dir"/data/agent/instances/*/instance.json; do
    [ -e "$f" ] || continue
    pg=$(sed -n 's/.*"pgid":\([0-9][0-9]*\).*/\1/p' "$f")
    [ -z "$pg" ] || kill -9 -- "-$pg" 2>/dev/null || true
  done
  grep -o " $dir/[^ ]*" /proc/self/mountinfo | sort -r | while read -r m; do umount -l "$m"; done
  rm -rf "$dir"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
http=$(free_port)
"$gpurent" up --data-dir "$dir/data" --listen "127.0.0.1:$http" --sim-gpus 1xRTX4090 \
  --min-disk-free-gb 0 >"$dir/up.log" 2>&1 &
pids+=($!)
url="http://127.0.0.1:$http"
until grep -q "gpurent ready" "$dir/up.log"; do sleep 0.2; done
cli() { "$gpurent" --server "$url" "$@"; }
admin=$(cat "$dir/data/admin.token")
token=$(cli --token "$admin" --json users create ada --credit 100 | python3 -c 'import json,sys; print(json.load(sys.stdin)["token"])')
size=$(( mib * 2 + 256 ))MiB
cli --token "$token" volumes create io --size "$size" >/dev/null 2>&1
volumes=$(ls -d "$dir"/data/agent/volumes)

# MiB/s from the "elapsed MS ms" line a timed dd prints (busybox's dd says no time, and its
# date no nanoseconds: /proc/uptime's hundredths are the clock).
rate() { sed -n 's/^elapsed \([0-9]*\) ms$/\1/p' | tail -1 | awk -v m="$mib" '{ printf "%.0f", m * 1000 / ($1 > 0 ? $1 : 1) }'; }
timed() {
  echo "s=\$(cut -d' ' -f1 /proc/uptime); $1 >/dev/null 2>&1; e=\$(cut -d' ' -f1 /proc/uptime); awk -v s=\$s -v e=\$e 'BEGIN { printf \"elapsed %d ms\\n\", (e - s) * 1000 }'"
}
# One reservation's dd; its log.
inside() {
  local image=$1 script=$2 args=(--gpu RTX-4090 --hours 1 --volume io:/v)
  [ -z "$image" ] || args+=(--image "$image")
  local id
  id=$(cli --token "$token" --json reserve "${args[@]}" -- sh -c "$script" |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
  until cli --token "$token" --json get "$id" |
    python3 -c 'import json,sys; sys.exit(json.load(sys.stdin)["status"] not in ("stopped", "failed"))'; do
    sleep 0.3
  done
  cli --token "$token" logs "$id"
}
write=$(timed "dd if=/dev/zero of=/v/f bs=1M count=$mib conv=fsync")
read=$(timed "dd if=/v/f of=/dev/null bs=1M")

rows=()
sh -c "$(timed "dd if=/dev/zero of=$volumes/outside bs=1M count=$mib conv=fsync")" >"$dir/w"
sync; echo 3 >/proc/sys/vm/drop_caches
sh -c "$(timed "dd if=$volumes/outside of=/dev/null bs=1M")" >"$dir/r"
ow=$(rate <"$dir/w"); or=$(rate <"$dir/r")
rm -f "$volumes/outside"
rows+=("outside (the volumes dir's disk)|$ow|$or")
places=("process|")
if docker image inspect gpurent-test/busybox >/dev/null 2>&1; then
  places+=("container|gpurent-test/busybox")
fi
for place in "${places[@]}"; do
  name=${place%%|*} image=${place#*|}
  w=$(inside "$image" "$write" | rate)
  sync; echo 3 >/proc/sys/vm/drop_caches
  r=$(inside "$image" "$read; rm -f /v/f" | rate)
  rows+=("in a volume, $name|$w|$r")
done

if [ "$json" = 1 ]; then
  printf '{"mib": %s, "places": [' "$mib"
  sep=""
  for row in "${rows[@]}"; do
    IFS='|' read -r n w r <<<"$row"
    printf '%s{"place": "%s", "write_mib_s": %s, "read_mib_s": %s, "write_pct": %s, "read_pct": %s}' \
      "$sep" "$n" "$w" "$r" "$(( w * 100 / ow ))" "$(( r * 100 / or ))"
    sep=", "
  done
  printf ']}\n'
else
  printf '%-36s %12s %8s %12s %8s\n' PLACE "WRITE MiB/s" "%" "READ MiB/s" "%"
  for row in "${rows[@]}"; do
    IFS='|' read -r n w r <<<"$row"
    printf '%-36s %12s %8s %12s %8s\n' "$n" "$w" "$(( w * 100 / ow ))" "$r" "$(( r * 100 / or ))"
  done
fi
