#!/usr/bin/env bash
# Throughput through a process instance's own network (pasta) against the node's shared one,
# with a real `gpurent up` (the isolated process executor: run as root):
#
#   scripts/bench_instance_network.sh own|shared [MIB]
#   scripts/bench_instance_network.sh starts [COUNT]
#
# Measured with curl, MIB MiB each (default 512): a published port through the control plane's
# proxy (/proxy/ID/PORT/, bearer token), `ssh -L` to the same server in the instance, and a
# download from inside the instance (a session) from a server on the node's own non-loopback
# address, against the same download by the node itself. Prints one line per figure, MiB/s.
# `starts`: COUNT (50) sandbox starts of `/bin/true` the way the process executor's wrapper makes
# them, with a network of its own (bwrap's FIFOs, pasta attached) and without; ms per start.
set -euo pipefail

if [ "${1:-}" = starts ]; then
  count=${2:-50}
  d=$(mktemp -d)
  trap 'rm -rf "$d"' EXIT
  sandbox=(bwrap --ro-bind / / --dev /dev --proc /proc --unshare-pid --unshare-ipc --unshare-uts
    --die-with-parent)
  inner=(setpriv --reuid=200000 --regid=200000 --clear-groups -- /bin/true)
  start_own() {
    rm -f "$d/net.info" "$d/net.go" "$d/pasta.pid"
    mkfifo -m 600 "$d/net.info" "$d/net.go"
    "${sandbox[@]}" --unshare-net --info-fd 4 --block-fd 5 -- "${inner[@]}" </dev/null \
      4>"$d/net.info" 5<>"$d/net.go" &
    local sb=$! pid pp
    pid=$(sed -n 's/.*"child-pid": *\([0-9][0-9]*\).*/\1/p' "$d/net.info")
    setpriv --inh-caps=-all --bounding-set=-all,+sys_admin,+net_admin --no-new-privs -- \
      pasta --runas 0:0 --quiet --config-net --no-map-gw -t none -u none -T none -U none \
      -a 10.0.2.100 -n 24 -g 10.0.2.2 -P "$d/pasta.pid" --netns /proc/self/fd/6 \
      6<"/proc/$pid/ns/net" && echo >"$d/net.go"
    wait "$sb"
    read -r pp <"$d/pasta.pid"
    kill -9 "$pp"
  }
  for mode in shared own; do
    s=$(date +%s%N)
    for _ in $(seq "$count"); do
      if [ "$mode" = own ]; then start_own; else "${sandbox[@]}" -- "${inner[@]}" </dev/null; fi
    done
    e=$(date +%s%N)
    echo "$mode network: $(( (e - s) / count / 1000 )) us per start"
  done
  exit 0
fi

mode=${1:?own or shared}
mib=${2:-512}
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
gpurent=${GPURENT:-$root/target/release/gpurent}
dir=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  # The agent leaves its instances running when it stops (a restarted one adopts them): end
  # each by its wrapper's process group (the sandbox dies with it) and its pasta.
  for f in "$dir"/data/agent/instances/*/instance.json; do
    [ -e "$f" ] || continue
    pg=$(sed -n 's/.*"pgid":\([0-9][0-9]*\).*/\1/p' "$f")
    [ -z "$pg" ] || kill -9 -- "-$pg" 2>/dev/null || true
    pp="${f%/instance.json}/pasta.pid"
    [ ! -s "$pp" ] || kill -9 "$(cat "$pp")" 2>/dev/null || true
  done
  rm -rf "$dir"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
http=$(free_port); sshp=$(free_port)
extra=()
[ "$mode" = shared ] && extra=(--shared-network)
"$gpurent" up --data-dir "$dir/data" --listen "127.0.0.1:$http" --ssh-listen "127.0.0.1:$sshp" \
  --sim-gpus 1xRTX4090 --executor process --min-disk-free-gb 0 "${extra[@]}" >"$dir/up.log" 2>&1 &
pids+=($!)
url="http://127.0.0.1:$http"
until grep -q "gpurent ready" "$dir/up.log"; do sleep 0.2; done
grep "instances' network" "$dir/up.log" >&2
cli() { "$gpurent" --server "$url" "$@"; }
admin=$(cat "$dir/data/admin.token")
ssh-keygen -q -t ed25519 -N "" -f "$dir/key"
token=$(cli --token "$admin" --json users create ada --credit 100 | python3 -c 'import json,sys; print(json.load(sys.stdin)["token"])')
cli --token "$token" keys add "$dir/key.pub" >/dev/null

# The instance serves MIB MiB of zeros to any GET on its published port.
port=$(free_port)
server="import http.server as s, sys
class H(s.BaseHTTPRequestHandler):
    def do_GET(self):
        n = int(sys.argv[2]) << 20
        self.send_response(200)
        self.send_header(\"Content-Length\", str(n))
        self.end_headers()
        chunk = bytes(1 << 20)
        for _ in range(n >> 20):
            self.wfile.write(chunk)
s.HTTPServer((\"127.0.0.1\", int(sys.argv[1])), H).serve_forever()"
id=$(cli --token "$token" --json reserve --gpu RTX-4090 --hours 1 --http-port "$port" -- \
  python3 -c "$server" "$port" "$mib" | python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
rate() { awk '{ printf "%.0f", $1 / 1048576 }'; }
until curl -sf -o /dev/null -H "Authorization: Bearer $token" "$url/proxy/$id/$port/"; do sleep 0.2; done
echo "published port: $(curl -s -o /dev/null -w '%{speed_download}' -H "Authorization: Bearer $token" "$url/proxy/$id/$port/" | rate) MiB/s"

ssh_opts=(-i "$dir/key" -F /dev/null -o BatchMode=yes -o IdentitiesOnly=yes -o StrictHostKeyChecking=no
  -o LogLevel=ERROR -o "UserKnownHostsFile=$dir/known_hosts" -p "$sshp")
fwd=$(free_port)
ssh "${ssh_opts[@]}" -N -L "$fwd:localhost:$port" "$id@127.0.0.1" &
pids+=($!)
until curl -sf -o /dev/null "http://127.0.0.1:$fwd/"; do sleep 0.2; done
echo "ssh -L: $(curl -s -o /dev/null -w '%{speed_download}' "http://127.0.0.1:$fwd/" | rate) MiB/s"

# A server on the node's own address; the node's download, then the instance's.
addr=$(python3 -c 'import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.connect(("192.0.2.1", 9)); print(s.getsockname()[0])')
nport=$(free_port)
python3 -c "${server//127.0.0.1/$addr}" "$nport" "$mib" 2>/dev/null &
pids+=($!)
until curl -sf -o /dev/null "http://$addr:$nport/"; do sleep 0.2; done
echo "node's own download: $(curl -s -o /dev/null -w '%{speed_download}' "http://$addr:$nport/" | rate) MiB/s"
inside=$(ssh "${ssh_opts[@]}" "$id@127.0.0.1" "curl -s -o /dev/null -w '%{speed_download}' http://$addr:$nport/")
echo "instance's download: $(echo "$inside" | rate) MiB/s"
cli --token "$token" stop "$id" >/dev/null
