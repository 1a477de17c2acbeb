#!/usr/bin/env bash
# The GPU check of issue 17, for a host with one NVIDIA GPU of 80 GB or more and PyTorch (run as
# root, with bubblewrap installed): two 40 GB shares of the GPU through `gpurent up` with real
# NVML and the isolated process executor.
#  1. one share runs the bf16 matmul job alone, then two shares run it at once: the throughput
#     of each against the one alone (time-slicing without MPS);
#  2. one share allocates 60 GB while the other runs the matmul: the first must end
#     `vram_exceeded` within the grace plus one sample (10 s + a 2 s heartbeat), the other
#     must run on to its end;
#  3. a table of the figures, and everything as JSON files in $OUT.
# Usage: scripts/gpu/shares.sh [GPURENT_BINARY]   (OUT defaults to a temporary folder)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BIN="$(realpath "${1:-$ROOT/target/release/gpurent}")"
OUT="${OUT:-$(mktemp -d)}"
SECONDS_PER_RUN="${SECONDS_PER_RUN:-20}"
GRACE=10
WORK="$(mktemp -d)"
PORT=18481
URL="http://127.0.0.1:$PORT"
say() { printf 'gpu-shares: %s\n' "$*" >&2; }

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >&2 || true
say "starting gpurent up with NVML and the process executor (grace ${GRACE}s)"
"$BIN" up --data-dir "$WORK/data" --listen "127.0.0.1:$PORT" --executor process \
  --vram-grace-secs "$GRACE" >"$WORK/up.out" 2>"$OUT/up.log" &
UP_PID=$!
trap 'kill $UP_PID 2>/dev/null || true; wait $UP_PID 2>/dev/null || true' EXIT
for _ in $(seq 1 300); do grep -q "gpurent ready" "$WORK/up.out" 2>/dev/null && break; sleep 0.1; done
grep -q "gpurent ready" "$WORK/up.out" || { say "gpurent up did not get ready"; tail -20 "$OUT/up.log" >&2; exit 1; }
ADMIN="$(cat "$WORK/data/admin.token")"
g() { "$BIN" --server "$URL" --json "$@"; }
field() { python3 -c 'import json,sys; print(json.load(sys.stdin)[sys.argv[1]])' "$1"; }
g --token "$ADMIN" nodes ls >"$OUT/nodes.json"
TENANT="$(g --token "$ADMIN" users create gpu-shares --credit 1000 | field token)"
GPU_TYPE="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[0]["gpus"][0]["model"])' "$OUT/nodes.json")"
MATMUL="$(cat "$ROOT/scripts/gpu/matmul.py")"
# Allocates 60 GB at once, then holds it: the share's process over its 40 GB.
HOG='import torch, time
x = torch.empty(60 * 1024**3, dtype=torch.uint8, device="cuda")
print("holding", x.numel(), flush=True)
time.sleep(120)'

# A 40 GB share running COMMAND...; prints its id. The job's environment is its own.
share() {
  g --token "$TENANT" reserve --gpu "$GPU_TYPE" --vram-gb 40 --hours 1 \
    --env "PYTHONPATH=${PYTHONPATH:-}" -- "$(command -v python3)" -c "$@" | field id
}
status() { g --token "$TENANT" get "$1" | field status; }
wait_end() {
  for _ in $(seq 1 600); do
    case "$(status "$1")" in stopped | failed | expired | lost) return 0 ;; esac
    sleep 0.5
  done
  say "reservation $1 did not end"
  return 1
}
tflops() {
  "$BIN" --server "$URL" --token "$TENANT" logs "$1" >"$OUT/$1.log" || true
  grep '^{' "$OUT/$1.log" | tail -1 | python3 -c 'import json,sys; print(json.load(sys.stdin)["tflops"])' 2>/dev/null || echo 0
}

say "one share alone (${SECONDS_PER_RUN}s)"
ALONE="$(share "$MATMUL" --seconds "$SECONDS_PER_RUN" --out /tmp/r.json)"
wait_end "$ALONE"
T_ALONE="$(tflops "$ALONE")"

say "two shares at once (${SECONDS_PER_RUN}s)"
S1="$(share "$MATMUL" --seconds "$SECONDS_PER_RUN" --out /tmp/r.json)"
S2="$(share "$MATMUL" --seconds "$SECONDS_PER_RUN" --out /tmp/r.json)"
wait_end "$S1"
wait_end "$S2"
T1="$(tflops "$S1")"
T2="$(tflops "$S2")"

say "one share takes 60 GB while the other computes"
NEIGHBOUR="$(share "$MATMUL" --seconds $((SECONDS_PER_RUN + 2 * GRACE)) --out /tmp/r.json)"
for _ in $(seq 1 120); do [ "$(status "$NEIGHBOUR")" = running ] && break; sleep 0.5; done
HOGGER="$(share "$HOG")"
wait_end "$HOGGER"
NEIGHBOUR_AT_STOP="$(status "$NEIGHBOUR")"
g --token "$TENANT" get "$HOGGER" >"$OUT/hogger.json"
g --token "$ADMIN" events >"$OUT/events.json"
wait_end "$NEIGHBOUR"
g --token "$TENANT" get "$NEIGHBOUR" >"$OUT/neighbour.json"
T_NEIGHBOUR="$(tflops "$NEIGHBOUR")"
"$BIN" --server "$URL" --token "$TENANT" logs "$HOGGER" >"$OUT/hogger.log" || true

python3 - "$OUT" "$GRACE" "$T_ALONE" "$T1" "$T2" "$T_NEIGHBOUR" "$NEIGHBOUR_AT_STOP" "$HOGGER" <<'PY'
import json, re, sys
from datetime import datetime
out, grace = sys.argv[1], int(sys.argv[2])
alone, t1, t2, neighbour = (float(x) for x in sys.argv[3:7])
neighbour_at_stop, hogger = sys.argv[7], sys.argv[8]
h = json.load(open(f"{out}/hogger.json"))
n = json.load(open(f"{out}/neighbour.json"))
events = json.load(open(f"{out}/events.json"))
t = lambda s: datetime.fromisoformat(re.sub(r"(\.\d{6})\d+", r"\1", s.replace("Z", "+00:00"))).timestamp()
over = [e for e in events if e.get("reservation_id") == hogger and e["kind"] == "vram_over_share"]
stopped_after = t(h["ended_at"]) - t(over[0]["at"]) if over and h.get("ended_at") else None
rows = [
    ("one 40 GB share alone, TFLOP/s (bf16 8192^3)", f"{alone:.1f}"),
    ("two shares at once, TFLOP/s each", f"{t1:.1f}, {t2:.1f}"),
    ("each of two against one alone", f"{100 * t1 / alone:.1f} %, {100 * t2 / alone:.1f} %" if alone else "-"),
    ("both together against one alone", f"{100 * (t1 + t2) / alone:.1f} %" if alone else "-"),
    ("share taking 60 GB: end", f"{h['status']} ({h['end_reason']})"),
    ("first over-share event to its end", f"{stopped_after:.1f} s (grace {grace} s + one 2 s sample)" if stopped_after is not None else "no event"),
    ("its neighbour when it ended", neighbour_at_stop),
    ("its neighbour's end", f"{n['status']} ({n['end_reason']}), {neighbour:.1f} TFLOP/s"),
]
w = max(len(r[0]) for r in rows)
for k, v in rows:
    print(f"{k:<{w}}  {v}")
json.dump(dict(rows), open(f"{out}/summary.json", "w"), indent=1)
PY
