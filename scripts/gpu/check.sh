#!/usr/bin/env bash
# The GPU check of the node agent (issue 3), for a host with an NVIDIA GPU and PyTorch:
#  1. the bf16 matmul job natively, then the same job reserved through `gpurent up` with real
#     NVML and the process executor (isolated: bubblewrap, a uid of its own, cgroup limits of
#     4 CPUs and 16 GiB per GPU; run as root, with bubblewrap installed);
#  2. while it runs, `gpurent nodes ls` must attribute its GPU memory to its reservation;
#  3. a table of the figures, and everything as JSON files in $OUT.
# Usage: scripts/gpu/check.sh [GPURENT_BINARY]   (OUT defaults to a temporary folder)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BIN="$(realpath "${1:-$ROOT/target/release/gpurent}")"
OUT="${OUT:-$(mktemp -d)}"
SECONDS_PER_RUN="${SECONDS_PER_RUN:-20}"
WORK="$(mktemp -d)"
PORT=18480
URL="http://127.0.0.1:$PORT"
say() { printf 'gpu-check: %s\n' "$*" >&2; }

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >&2 || true
say "native run (${SECONDS_PER_RUN}s)"
python3 "$ROOT/scripts/gpu/matmul.py" --seconds "$SECONDS_PER_RUN" --out "$OUT/native.json" >&2

say "starting gpurent up with NVML and the process executor"
"$BIN" up --data-dir "$WORK/data" --listen "127.0.0.1:$PORT" --executor process \
  >"$WORK/up.out" 2>"$OUT/up.log" &
UP_PID=$!
trap 'kill $UP_PID 2>/dev/null || true; wait $UP_PID 2>/dev/null || true' EXIT
for _ in $(seq 1 300); do grep -q "gpurent ready" "$WORK/up.out" 2>/dev/null && break; sleep 0.1; done
grep -q "gpurent ready" "$WORK/up.out" || { say "gpurent up did not get ready"; tail -20 "$OUT/up.log" >&2; exit 1; }
ADMIN="$(cat "$WORK/data/admin.token")"
g() { "$BIN" --server "$URL" --json "$@"; }
g --token "$ADMIN" nodes ls >"$OUT/nodes-idle.json"
TENANT="$(g --token "$ADMIN" users create gpu-check --credit 1000 | python3 -c 'import json,sys; print(json.load(sys.stdin)["token"])')"
GPU_TYPE="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[0]["gpus"][0]["model"])' "$OUT/nodes-idle.json")"
say "reserving one $GPU_TYPE for the same job"
T0="$(date +%s.%N)"
# The job's environment is its own (the agent's is not inherited): pass what python needs.
# It runs sandboxed: this checkout and $OUT do not exist for it (the node's /usr, /etc and
# /opt do), so the script goes inline and its result comes back through its log.
g --token "$TENANT" reserve --gpu "$GPU_TYPE" --hours 1 --env "PYTHONPATH=${PYTHONPATH:-}" -- \
  "$(command -v python3)" -c "$(cat "$ROOT/scripts/gpu/matmul.py")" --seconds "$SECONDS_PER_RUN" --out /tmp/reserved.json \
  >"$OUT/reservation.json"
ID="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["id"])' "$OUT/reservation.json")"
RUNNING_AT=""
ATTRIBUTED=0
for _ in $(seq 1 600); do
  STATUS="$(g --token "$TENANT" get "$ID" | python3 -c 'import json,sys; print(json.load(sys.stdin)["status"])')"
  if [ "$STATUS" = running ] && [ -z "$RUNNING_AT" ]; then RUNNING_AT="$(date +%s.%N)"; fi
  if [ "$STATUS" = running ] && [ "$ATTRIBUTED" = 0 ]; then
    g --token "$ADMIN" nodes ls >"$OUT/nodes-busy.json"
    ATTRIBUTED="$(python3 - "$OUT/nodes-busy.json" "$ID" <<'PY'
import json, sys
nodes, rid = json.load(open(sys.argv[1])), sys.argv[2]
mb = sum(p["used_mb"] for n in nodes for g in n["gpus"] for p in (g.get("telemetry") or {}).get("processes", []) if p.get("reservation_id") == rid)
print(mb)
PY
)"
  fi
  case "$STATUS" in stopped|failed|expired|lost) break ;; esac
  sleep 0.5
done
g --token "$TENANT" get "$ID" >"$OUT/reservation-end.json"
"$BIN" --server "$URL" --token "$TENANT" logs "$ID" >"$OUT/reserved.log" || true
grep '^{' "$OUT/reserved.log" | tail -1 >"$OUT/reserved.json" || true
CONFINED="$(grep -c "isolates instances" "$OUT/up.log" || true)"
python3 - "$OUT" "$T0" "${RUNNING_AT:-0}" "$ATTRIBUTED" "$CONFINED" <<'PY'
import json, sys
out, t0, running_at, attributed, confined = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
native = json.load(open(f"{out}/native.json"))
reserved = json.load(open(f"{out}/reserved.json"))
end = json.load(open(f"{out}/reservation-end.json"))
rows = [
    ("GPU", native["device"]),
    ("native TFLOP/s (bf16 8192^3)", f"{native['tflops']:.1f}"),
    ("reserved TFLOP/s (process executor)", f"{reserved['tflops']:.1f}"),
    ("reserved / native", f"{100 * reserved['tflops'] / native['tflops']:.2f} %"),
    ("isolated (bwrap, a uid of its own, cgroup limits)", "yes" if confined else "NO"),
    ("CUDA_VISIBLE_DEVICES in the job", reserved["cuda_visible_devices"]),
    ("reservation id seen by the job", "yes" if reserved["reservation_id"] == end["id"] else "NO"),
    ("GPU memory attributed to the reservation", f"{attributed} MiB"),
    ("reserve-to-running (polled every 0.5 s)", f"{running_at - t0:.2f} s" if running_at else "never"),
    ("final status", f"{end['status']} ({end['end_reason']}), charged {end['charged']}"),
]
w = max(len(r[0]) for r in rows)
for k, v in rows:
    print(f"{k:<{w}}  {v}")
json.dump(dict(rows), open(f"{out}/summary.json", "w"), indent=1)
PY
