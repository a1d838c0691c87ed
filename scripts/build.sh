#!/usr/bin/env bash
# Configures and builds one tree quietly; prints the compiler output only when the build fails.
# Usage: scripts/build.sh DIR [cmake -D options...]
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
if ! cmake -S . -B "$dir" "$@" >"$log" 2>&1 || ! cmake --build "$dir" -- -j"$(nproc)" >>"$log" 2>&1; then
  grep -E 'error|Error|FAILED' "$log" | head -n 40 >&2 || true
  echo "build: $dir FAILED; full log in $log" >&2
  tail -n 60 "$log" >&2
  exit 1
fi
echo "build: $dir ok in $(( $(date +%s) - t0 )) s"
