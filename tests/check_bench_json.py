#!/usr/bin/env python3
"""ctest cli_bench_micro: runs `bevformer bench --json` on the micro golden config and checks the
object a user's script would read, plain and --pipeline: the documented keys, one latency per timed frame, ordered
statistics, a positive throughput, stages that sum to the profiled frame, and the FLOP count.

    python3 tests/check_bench_json.py BEVFORMER CONFIG.json"""

import json
import subprocess
import sys


def check(binary, config, pipeline):
    frames = 3
    extra = ["--pipeline"] if pipeline else []
    out = subprocess.run([binary, "-q", "bench", "--config", config, "--frames", str(frames), "--threads", "2",
                          "--no-peak", "--json"] + extra, check=True, stdout=subprocess.PIPE, text=True).stdout
    j = json.loads(out)
    for key in ("median_ms", "p90_ms", "fps", "stages", "peak_rss_mb", "frame_ms", "parts_ms", "gflop_per_frame"):
        assert key in j, f"missing key {key}"
    assert len(j["frame_ms"]) == frames, j["frame_ms"]
    assert 0 < j["min_ms"] <= j["median_ms"] <= j["p90_ms"] <= j["max_ms"], j
    assert j["fps"] > 0 and j["peak_rss_mb"] > 0
    assert j["mode"] == ("replay, pipelined" if pipeline else "replay") and j["precision"] == "f32", j["mode"]
    names = [s["name"] for s in j["stages"]]
    for stage in ("img.stem", "img.layer1", "img.neck", "enc0.tsa", "enc0.sca", "dec.pack"):
        assert stage in names, f"stage {stage} missing from {names}"
    assert abs(sum(s["ms"] for s in j["stages"]) - j["stage_sum_ms"]) < 1e-6 * max(1.0, j["stage_sum_ms"])
    assert abs(sum(s["percent"] for s in j["stages"]) - 100) < 1e-6
    assert j["gflop_per_frame"] > 0 and j["peak_gflops"] == 0  # --no-peak
    print(f"bench json ok ({j['mode']}): median {j['median_ms']:.1f} ms, {j['fps']:.1f} frames/s, {len(names)} stages, "
          f"{j['gflop_per_frame']:.3f} GFLOP")


def main():
    binary, config = sys.argv[1], sys.argv[2]
    check(binary, config, pipeline=False)
    check(binary, config, pipeline=True)
    # --pipeline needs a third warm-up frame (the second lane records on frames 1 and 2).
    bad = subprocess.run([binary, "-q", "bench", "--config", config, "--frames", "1", "--warmup", "2", "--pipeline",
                          "--no-peak", "--no-stages"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert bad.returncode == 2 and "at least 3" in bad.stderr, (bad.returncode, bad.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
