#!/usr/bin/env bash
# A soak of one `bevformer serve` at its stream capacity (issue 45): --max-streams 64, first 64
# vehicles in closed loop (each sends its next frame when the last is answered) for SECONDS, then
# 128 for SECONDS. Checked: every request answered 200; with 64 vehicles no frame after a
# stream's first runs without history and nothing is evicted; with 128 every frame that lost its
# history was told why ("history evicted" in history_reset), and the server's eviction counter
# moved. The server's RSS is sampled every 5 s and printed as a curve.
# Usage: scripts/soak.sh BUILD_DIR [SECONDS]   (default 300 per phase; CI runs 12)
# The micro golden model (tiny images: the server's own overhead, not the model, is soaked).
set -euo pipefail
dir=$(realpath "$1")
seconds=${2:-300}
cd "$(dirname "$0")/.."
work=$(mktemp -d)
server_pid=
sampler_pid=
cleanup() {
  [ -n "$sampler_pid" ] && kill "$sampler_pid" 2>/dev/null || true
  [ -n "$server_pid" ] && kill -TERM "$server_pid" 2>/dev/null && wait "$server_pid" || true
  rm -rf "$work"
}
trap cleanup EXIT

micro=$(realpath ../shared/golden/micro)
python3 scripts/micro_frames.py "$micro" "$work"
frames=("$work"/frame0.json "$work"/frame1.json "$work"/frame2.json)

"$dir/bin/bevformer" -q serve --config "$micro/config.json" --weights "$micro/checkpoint.pth" --port 0 \
  --threads "$(nproc)" --max-streams 64 --queue 256 --timeout 600 >"$work/serve.out" 2>"$work/serve.err" &
server_pid=$!
for _ in $(seq 600); do grep -q listening "$work/serve.out" 2>/dev/null && break; sleep 0.1; done
port=$(sed -n 's/.*:\([0-9]*\)$/\1/p' "$work/serve.out" | head -n1)
[ -n "$port" ] || { cat "$work/serve.err" >&2; exit 1; }
echo "soak: bevformer serve (micro) on port $port, --max-streams 64; $(nproc) cores; ${seconds} s per phase"

# RSS every 5 s, from the start.
( t0=$(date +%s); while kill -0 "$server_pid" 2>/dev/null; do
    echo "$(( $(date +%s) - t0 )) $(awk '/VmRSS/ {print $2}' /proc/"$server_pid"/status 2>/dev/null)" >>"$work/rss"
    sleep 5
  done ) &
sampler_pid=$!

evictions() {
  python3 -c "import urllib.request, sys; print(urllib.request.urlopen(sys.argv[1]).read().decode())" \
    "http://127.0.0.1:$port/metrics" | awk '/^bevformer_stream_evictions_lru_total/ {print $2}'
}
fail=0
for vehicles in 64 128; do
  before=$(evictions)
  out=$("$dir/bin/load_client" --port "$port" --streams "$vehicles" --seconds "$seconds" --warmup 2 "${frames[@]}") || {
    echo "$out"; echo "soak: $vehicles vehicles: a request was not answered 200" >&2; fail=1; }
  echo "$out" | sed "s/^/  [$vehicles vehicles] /"
  after=$(evictions)
  read -r lost told evicted < <(echo "$out" | sed -n 's/.*history: \([0-9]*\) frames.*, \([0-9]*\) told why, \([0-9]*\) of them evicted/\1 \2 \3/p')
  echo "  [$vehicles vehicles] evictions counted by the server: $(( ${after%.*} - ${before%.*} ))"
  if [ "$vehicles" -le 64 ]; then
    if [ "$lost" != 0 ] || [ "${after%.*}" != "${before%.*}" ]; then
      echo "soak: $vehicles vehicles in a table of 64 lost histories ($lost frames, evictions ${before} -> ${after})" >&2; fail=1
    fi
  elif [ "$lost" != "$told" ] || [ "$evicted" = 0 ] || [ "${after%.*}" = "${before%.*}" ]; then
    echo "soak: $vehicles vehicles: $lost frames without history, $told told why, $evicted evicted (want all told, some evicted)" >&2
    fail=1
  fi
done
kill "$sampler_pid" 2>/dev/null || true
sampler_pid=
echo "soak: server RSS (s, MiB): $(awk '{printf "%s %.0f  ", $1, $2 / 1024}' "$work/rss")"
[ "$fail" = 0 ] && echo "soak: passed" || { echo "soak: FAILED" >&2; exit 1; }
