#!/usr/bin/env bash
# Load on `bevformer serve` over HTTP at 1, 4 and 16 concurrent streams: throughput and p50/p99
# latency per level (bench/load_client.cpp, closed loop: each stream sends its next frame when
# the previous one is answered).
# Usage: scripts/load_test.sh BUILD_DIR [micro|tiny] [SECONDS] [--multipart | --oip]
#   --oip: Open Inference Protocol requests (binary tensor data, X-Sequence-Id; docs/DEPLOY.md)
# LOAD_PORT (environment): load a server (or balancer: scripts/fleet.sh) already listening on
# this port instead of starting one; it must serve the same model.
#   micro: the golden micro model (tiny images; measures the server's own overhead)
#   tiny:  the tiny preset, seeded random weights, on the bundled nuScenes frame (6 x 1600x900 JPEG)
# WARMUP (environment, default 3): seconds per level before measuring; the answers that arrive in
# the SECONDS after it are counted (throughput) and their latencies ranked (p50, p99).
set -euo pipefail
dir=$(realpath "$1")
model=${2:-micro}
seconds=${3:-20}
mode=${4:-}
cd "$(dirname "$0")/.."
work=$(mktemp -d)
server_pid=
cleanup() {
  [ -n "$server_pid" ] && kill -TERM "$server_pid" 2>/dev/null && wait "$server_pid" || true
  rm -rf "$work"
}
trap cleanup EXIT

case "$model" in
  micro)
    micro=$(realpath ../shared/golden/micro)
    # The micro set's three frames as frame JSON files (as tests/micro_frames.h builds them).
    python3 scripts/micro_frames.py "$micro" "$work"
    serve_args=(--config "$micro/config.json" --weights "$micro/checkpoint.pth")
    frames=("$work"/frame0.json "$work"/frame1.json "$work"/frame2.json)
    ;;
  tiny)
    "$dir/bin/bevformer" -q convert-info data/nuscenes-demo/info.json "$work/frames" --stream demo
    serve_args=(--config tiny)
    frames=("$work"/frames/frame_*.json)
    ;;
  *) echo "usage: $0 BUILD_DIR [micro|tiny] [SECONDS] [--multipart | --oip]" >&2; exit 2 ;;
esac

if [ -n "${LOAD_PORT:-}" ]; then
  port=$LOAD_PORT
  echo "load: the server on port $port; $(nproc) cores; ${seconds} s per level ${mode}"
else
  "$dir/bin/bevformer" -q serve "${serve_args[@]}" --port 0 --threads "$(nproc)" --queue 64 --timeout 600 >"$work/serve.out" 2>"$work/serve.err" &
  server_pid=$!
  for _ in $(seq 600); do grep -q listening "$work/serve.out" 2>/dev/null && break; sleep 0.1; done
  port=$(sed -n 's/.*:\([0-9]*\)$/\1/p' "$work/serve.out" | head -n1)
  [ -n "$port" ] || { cat "$work/serve.err" >&2; exit 1; }
  echo "load: bevformer serve ${serve_args[*]} on port $port; $(nproc) cores; ${seconds} s per level ${mode}"
fi
for n in 1 4 16; do
  "$dir/bin/load_client" --port "$port" --streams "$n" --seconds "$seconds" --warmup "${WARMUP:-3}" $mode "${frames[@]}"
done
