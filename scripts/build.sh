#!/usr/bin/env bash
# Configures and builds one tree: progress every 20 s, the compiler output only when the build fails.
# Usage: [TARGET=name] scripts/build.sh DIR [cmake -D options...]   (TARGET: one target and what it needs)
set -euo pipefail
dir=$1
shift
cd "$(dirname "$0")/.."
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
mkdir -p "$dir"
log="$dir/build.log"
t0=$(date +%s)
if [ ! -f "$dir/build.ninja" ]; then
  set -- -G Ninja "${launcher[@]}" "$@"
fi
fail() {
  grep -E 'error|Error|FAILED' "$log" | head -n 40 >&2 || true
  echo "build: $dir FAILED; full log in $log" >&2
  tail -n 60 "$log" >&2
  exit 1
}
cmake -S . -B "$dir" "$@" >"$log" 2>&1 || fail
# The build runs in the background while its progress ([done/total] steps, from ninja's log
# lines) is printed every 20 s: a first build takes many minutes, and a silent one looks hung.
target=()
[ -n "${TARGET:-}" ] && target=(--target "$TARGET")
cmake --build "$dir" "${target[@]}" -- -j"$(nproc)" >>"$log" 2>&1 &
pid=$!
last=""
while kill -0 "$pid" 2>/dev/null; do
  for _ in $(seq 20); do kill -0 "$pid" 2>/dev/null && sleep 1; done
  step=$(grep -o '^\[[0-9]*/[0-9]*\]' "$log" | tail -n 1 || true)
  if [ -n "$step" ] && [ "$step" != "$last" ] && kill -0 "$pid" 2>/dev/null; then
    echo "build: $dir $step steps, $(( $(date +%s) - t0 )) s"
    last=$step
  fi
done
wait "$pid" || fail
echo "build: $dir ok in $(( $(date +%s) - t0 )) s"
