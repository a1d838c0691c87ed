#!/usr/bin/env bash
# A fleet on loopback (docs/DEPLOY.md): N `bevformer serve` over the golden micro set and HAProxy
# in front, routing by sequence id with deploy/haproxy.cfg's rules; every server drains through
# HAProxy on SIGTERM (--handoff-via). Runs until SIGINT/SIGTERM, or for SECONDS when given; then
# stops the servers one by one (each hands its streams to the ones left) and HAProxy.
# Usage: scripts/fleet.sh BUILD_DIR N [SECONDS]
# Environment: PORT (default 8080): HAProxy's port (its gRPC frontend on PORT+100), servers on
# PORT+1..PORT+N and their gRPC on PORT+101..PORT+100+N. FLEET_DIR: where haproxy.cfg, the pid files (s1.pid, ..., haproxy.pid)
# and the logs go (default: a temporary directory, removed at exit). SERVE_ARGS: more serve options.
set -euo pipefail
bin=$(realpath "$1")/bin/bevformer
n=$2
seconds=${3:-}
port=${PORT:-8080}
cd "$(dirname "$0")/.."
micro=$(realpath ../shared/golden/micro)
if [ -n "${FLEET_DIR:-}" ]; then
  dir=$FLEET_DIR
  mkdir -p "$dir"
  keep=1
else
  dir=$(mktemp -d)
  keep=0
fi
pids=()
haproxy_pid=
stop() {
  trap - EXIT INT TERM
  for i in "${!pids[@]}"; do
    kill -TERM "${pids[$i]}" 2>/dev/null && wait "${pids[$i]}" 2>/dev/null || true
  done
  [ -n "$haproxy_pid" ] && kill -TERM "$haproxy_pid" 2>/dev/null && wait "$haproxy_pid" 2>/dev/null || true
  [ "$keep" = 1 ] || rm -rf "$dir"
  echo "fleet: stopped"
}
trap stop EXIT
trap 'exit 0' INT TERM

# deploy/haproxy.cfg with this fleet's ports and servers.
awk -v port="$port" -v n="$n" '
  /# BEGIN SERVERS/ { print; for (i = 1; i <= n; i++) printf "  server s%d 127.0.0.1:%d\n", i, port + i; skip = 1; next }
  /# BEGIN GRPC SERVERS/ { print; for (i = 1; i <= n; i++) printf "  server s%d 127.0.0.1:%d proto h2 check-proto h1 port %d\n", i, port + 100 + i, port + i; skip = 1; next }
  /# END (GRPC )?SERVERS/ { skip = 0 }
  skip { next }
  { sub("bind 127.0.0.1:8080", "bind 127.0.0.1:" port); sub("bind 127.0.0.1:8180", "bind 127.0.0.1:" port + 100); print }
' deploy/haproxy.cfg >"$dir/haproxy.cfg"
haproxy -c -q -f "$dir/haproxy.cfg"

for i in $(seq 1 "$n"); do
  # shellcheck disable=SC2086
  "$bin" serve --config "$micro/config.json" --weights "$micro/checkpoint.pth" --host 127.0.0.1 \
    --port $((port + i)) --grpc-port $((port + 100 + i)) --handoff-via "http://127.0.0.1:$port" \
    --drain-timeout-s 20 ${SERVE_ARGS:-} >"$dir/s$i.out" 2>"$dir/s$i.log" &
  pids+=($!)
  echo $! >"$dir/s$i.pid"
done
haproxy -db -f "$dir/haproxy.cfg" >"$dir/haproxy.log" 2>&1 &
haproxy_pid=$!
echo "$haproxy_pid" >"$dir/haproxy.pid"

# Ready once every server answers ready and HAProxy has seen it up (rise 2 x 200 ms).
for i in $(seq 1 "$n"); do
  for _ in $(seq 1 600); do
    if curl -sf "http://127.0.0.1:$((port + i))/v2/health/ready" >/dev/null 2>&1; then break; fi
    kill -0 "${pids[$((i - 1))]}" 2>/dev/null || { echo "fleet: server s$i exited; see $dir/s$i.log" >&2; tail -5 "$dir/s$i.log" >&2; exit 1; }
    sleep 0.1
  done
done
sleep 1
curl -sf "http://127.0.0.1:$port/v2/health/ready" >/dev/null || { echo "fleet: HAProxy does not answer; see $dir/haproxy.log" >&2; exit 1; }
echo "fleet: ready: http://127.0.0.1:$port, gRPC 127.0.0.1:$((port + 100)) ($n servers, HTTP ports $((port + 1))-$((port + n)), gRPC $((port + 101))-$((port + 100 + n)); files in $dir)"
if [ -n "$seconds" ]; then
  sleep "$seconds"
else
  wait "$haproxy_pid"
fi
