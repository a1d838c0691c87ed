#!/usr/bin/env bash
# Runs every libFuzzer target for a bounded time on a fresh seed corpus.
# Usage: scripts/fuzz.sh BUILD_DIR SECONDS
set -euo pipefail
dir=$1
seconds=$2
cd "$(dirname "$0")/.."
work=$(mktemp -d)
# Fuzzers still running when the script stops (interrupted, or a failed step) are stopped too.
# (A job is run_target's subshell; the fuzzer is its child, stopped first.)
stop_fuzzers() {
  for j in $(jobs -p); do
    pkill -TERM -P "$j" 2>/dev/null || true
    kill "$j" 2>/dev/null || true
  done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap stop_fuzzers EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
artifacts="$dir/fuzz-artifacts"  # crash reproducers outlive the run
mkdir -p "$artifacts"
"$dir/bin/fuzz_make_seeds" "$work/seeds"
# fuzz_server_request: "Content-Type\n" + body; a frame with a 2x2 PNG inline, and as multipart.
png=iVBORw0KGgoAAAANSUhEUgAAAAIAAAACCAIAAAD91JpzAAAAEElEQVR4nGMQUDAAIgYIBQAKDgGBVjPu8wAAAABJRU5ErkJggg==
frame='"stream":"s","timestamp":1.5,"T_world_from_ego":[[1,0,0,0],[0,1,0,0],[0,0,1,0],[0,0,0,1]]'
cam='"name":"CAM_FRONT","K":[[1,0,1],[0,1,1],[0,0,1]],"T_ego_from_cam":[[1,0,0,0],[0,1,0,0],[0,0,1,0],[0,0,0,1]]'
mkdir -p "$work/seeds/fuzz_server_request"
printf 'application/json\n{%s,"cameras":[{%s,"image":{"base64":"%s"}}]}' "$frame" "$cam" "$png" \
  >"$work/seeds/fuzz_server_request/json"
{
  printf 'multipart/form-data; boundary=B\n--B\r\nContent-Disposition: form-data; name="frame"\r\n'
  printf 'Content-Type: application/json\r\n\r\n{%s,"cameras":[{%s,"image":"c0"}]}\r\n' "$frame" "$cam"
  printf -- '--B\r\nContent-Disposition: form-data; name="c0"; filename="c0.png"\r\n\r\n'
  echo -n "$png" | base64 -d
  printf '\r\n--B--\r\n'
} >"$work/seeds/fuzz_server_request/multipart"
# fuzz_eval_results: results_nusc.json, then \x1e and nuseval-gt-1 (one car matched, one NaN velocity).
mkdir -p "$work/seeds/fuzz_eval_results"
box='"translation":[10.0,0.5,1.0],"size":[1.9,4.6,1.7],"rotation":[1.0,0.0,0.0,0.0]'
{
  printf '{"meta":{"use_camera":true},"results":{"s0":[{"sample_token":"s0",%s,"velocity":[1.0,0.0],' "$box"
  printf '"detection_name":"car","detection_score":0.5,"attribute_name":"vehicle.moving"}],"s1":[]}}\x1e'
  printf '{"format":"nuseval-gt-1","samples":{"s0":{"ego_pose":{"translation":[0.0,0.0,0.0]},"boxes":[{%s,' "$box"
  printf '"velocity":[NaN,NaN],"detection_name":"car","attribute_name":"","num_pts":3}]},'
  printf '"s1":{"ego_pose":{"translation":[5.0,0.0,0.0]},"bike_racks":[{%s}],"boxes":[]}}}' "$box"
} >"$work/seeds/fuzz_eval_results/pair"
# fuzz_http_connection: a split byte, then bytes on a connection: pipelined GETs, a frame POST
# (the JSON seed's body), a HEAD, a 100-continue and a request cut short.
mkdir -p "$work/seeds/fuzz_http_connection"
body=$(tail -c +18 "$work/seeds/fuzz_server_request/json")
{
  printf '\x07GET /healthz HTTP/1.1\r\nHost: a\r\n\r\nHEAD /v1/model?x=1 HTTP/1.1\r\nHost: a\r\n\r\n'
  printf 'POST /v1/streams/s/frames HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\n'
  printf 'Expect: 100-continue\r\nContent-Length: %d\r\n\r\n%s' "${#body}" "$body"
  printf 'DELETE /v1/streams/s HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n'
} >"$work/seeds/fuzz_http_connection/pipelined"
printf '\x81GET / HTTP/1.0\r\n\r\nPOST /v1/streams/s/frames HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\n{' \
  >"$work/seeds/fuzz_http_connection/short"
# fuzz_pandaset: a selector byte ('0' poses, '1' timestamps, '2' intrinsics), then the file.
mkdir -p "$work/seeds/fuzz_pandaset"
printf '0[{"position":{"x":120.5,"y":-40.25,"z":1.85},"heading":{"w":0.98,"x":0.0,"y":0.0,"z":0.19899748742132398}}]' \
  >"$work/seeds/fuzz_pandaset/poses"
printf '1[1557540000.25,1557540000.35]' >"$work/seeds/fuzz_pandaset/timestamps"
printf '2{"fx":1970.01,"fy":1970.01,"cx":970.0,"cy":483.2}' >"$work/seeds/fuzz_pandaset/intrinsics"
# fuzz_oip_request: the Inference-Header-Content-Length value ("-": none), a newline, the body: a
# JSON request with the frame seed inline, and one with FRAME and IMAGES in the binary section.
mkdir -p "$work/seeds/fuzz_oip_request"
python3 - "$work/seeds" "$body" "$png" <<'PY'
import base64, json, struct, sys
seeds, frame, png = sys.argv[1], sys.argv[2], base64.b64decode(sys.argv[3])
el = lambda b: struct.pack("<I", len(b)) + b
params = {"sequence_id": 7, "sequence_start": True, "binary_data_output": True}
j = {"id": "a", "parameters": params, "inputs": [{"name": "FRAME", "datatype": "BYTES", "shape": [1], "data": [frame]}],
     "outputs": [{"name": "BOXES", "parameters": {"binary_data": True}}]}
open(f"{seeds}/fuzz_oip_request/json", "wb").write(b"-\n" + json.dumps(j).encode())
fb, ib = el(frame.encode()), el(png)
h = json.dumps({"parameters": params, "inputs": [
    {"name": "FRAME", "datatype": "BYTES", "shape": [1], "parameters": {"binary_data_size": len(fb)}},
    {"name": "IMAGES", "datatype": "BYTES", "shape": [1], "parameters": {"binary_data_size": len(ib)}}]}).encode()
open(f"{seeds}/fuzz_oip_request/binary", "wb").write(str(len(h)).encode() + b"\n" + h + fb + ib)
# fuzz_grpc_infer: the same request as ModelInferRequest wire bytes (written by hand: no protobuf here).
def varint(n):
    out = b""
    while True:
        b, n = n & 0x7F, n >> 7
        out += bytes([b | (0x80 if n else 0)])
        if not n:
            return out
fld = lambda num, b: varint(num << 3 | 2) + varint(len(b)) + b
def param(k, v):  # map<string, InferParameter> entry
    p = varint(1 << 3 | 0) + varint(int(v)) if isinstance(v, bool) else fld(3, v.encode())
    return fld(4, fld(1, k.encode()) + fld(2, p))
def tensor(name, n):
    return fld(5, fld(1, name.encode()) + fld(2, b"BYTES") + fld(3, varint(n)))
m = fld(1, b"bevformer") + param("sequence_id", "car-1") + param("sequence_start", True) + tensor("FRAME", 1) + \
    tensor("IMAGES", 1) + fld(7, fb) + fld(7, ib)
import os
os.makedirs(f"{seeds}/fuzz_grpc_infer", exist_ok=True)
open(f"{seeds}/fuzz_grpc_infer/request", "wb").write(m)
PY
# fuzz_stream_handoff: a header that reaches the checksum (the fuzzer varies lengths and flags).
mkdir -p "$work/seeds/fuzz_stream_handoff"
printf 'BEVHIST1\x01\x00\x00\x00\x07\x00\x00\x00' >"$work/seeds/fuzz_stream_handoff/header"
head -c 120 /dev/zero >>"$work/seeds/fuzz_stream_handoff/header"
# fuzz_calibration: a calibration file with a u8 and an s8 input range and an output range.
mkdir -p "$work/seeds/fuzz_calibration"
printf '{"format": "bevformer-calibration-v2", "model": "bevfp1-0", "config": "tiny", "frames": 2, "ranges": {"img_backbone.layer1.0.conv1": {"min": 0.0, "max": 4.75}, "img_neck.fpn_convs.0": {"min": -2.5, "max": 3e-3}}, "outputs": {"img_backbone.layer1.0.downsample": {"min": -1.5, "max": 2.0}}}' \
  >"$work/seeds/fuzz_calibration/calibration.json"
targets=(fuzz_pth fuzz_safetensors fuzz_pickle fuzz_frame_json fuzz_pandaset fuzz_server_request fuzz_eval_results fuzz_http_connection
  fuzz_oip_request fuzz_stream_handoff fuzz_calibration)
[ -x "$dir/bin/fuzz_grpc_infer" ] && targets+=(fuzz_grpc_infer)  # built with BEV_GRPC
# Targets run side by side, one per CPU and at most four (each may take -rss_limit_mb): the same
# seconds each, in half the wall time on CI's two cores.
run_target() {
  local target=$1
  mkdir -p "$work/$target"
  cp "$work/seeds/$target"/* "$work/$target/"
  # Inputs that once crashed a target are replayed first, every run.
  if [ -d "fuzz/regressions/$target" ]; then cp "fuzz/regressions/$target"/* "$work/$target/"; fi
  if "$dir/bin/$target" "$work/$target" -max_total_time="$seconds" -max_len=65536 -timeout=10 \
      -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$artifacts/$target-" >"$work/$target.log" 2>&1; then
    echo "fuzz: $target ok: $(grep -E '^stat::number_of_executed_units' "$work/$target.log" | awk '{print $2}') runs in ${seconds} s" \
      >"$work/$target.result"
  else
    {
      echo "fuzz: $target FAILED"
      tail -n 40 "$work/$target.log"
      for f in "$artifacts/$target"-*; do
        [ -e "$f" ] || continue
        echo "fuzz: reproducer $f (replay: $dir/bin/$target $f); base64 head: $(base64 -w0 "$f" | head -c 400)"
      done
    } >"$work/$target.failed"
  fi
}
jobs_at_once=$(( $(nproc) < 4 ? $(nproc) : 4 ))
for target in "${targets[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$jobs_at_once" ]; do wait -n || true; done
  run_target "$target" &
done
wait
fail=0
for target in "${targets[@]}"; do
  if [ -f "$work/$target.result" ]; then
    cat "$work/$target.result"
  else
    cat "$work/$target.failed" >&2 2>/dev/null || echo "fuzz: $target FAILED (no result)" >&2
    fail=1
  fi
done
exit $fail
