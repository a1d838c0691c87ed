#!/usr/bin/env python3
"""Batch sizes side by side: `bevformer bench --streams S --batch N` for each N, interleaved over
rounds (so a machine's drift hits every size alike), medians per size, ratios against batch 1.

    python3 scripts/bench_batch.py [--bin build/bin/bevformer] [--config tiny] [--precision f32]
        [--streams 8] [--batches 1,2,4,8] [--rounds 2] [--frames 2] [--warmup 2] [--threads 0]
        [--json OUT.json]

Per batch size: frames/s (the fleet's throughput), the median frame latency (a frame's batch's
wall time), the image and bev stage per frame (a batch's stage time over its frames), the bev
stage per frame against batch 1's, and the batched stages' arena memory per batch slot.
Standard library only."""

import argparse
import json
import statistics
import subprocess
import sys


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bin", default="build/bin/bevformer")
    p.add_argument("--config", default="tiny")
    p.add_argument("--precision", default="f32", choices=["f32", "bf16"])
    p.add_argument("--streams", type=int, default=8)
    p.add_argument("--batches", default="1,2,4,8")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--frames", type=int, default=2, help="timed steps per vehicle")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--backend", default="cpu")
    p.add_argument("--json", help="write every run's report here")
    a = p.parse_args()
    batches = [int(b) for b in a.batches.split(",")]
    if any(b < 1 or b > a.streams for b in batches):
        sys.exit(f"batch sizes must lie in 1..--streams ({a.streams})")
    runs = {b: [] for b in batches}
    for r in range(a.rounds):
        for b in batches:
            cmd = [a.bin, "-q", "bench", "--config", a.config, "--precision", a.precision, "--streams", str(a.streams),
                   "--batch", str(b), "--frames", str(a.frames), "--warmup", str(a.warmup), "--threads",
                   str(a.threads), "--backend", a.backend, "--no-stages", "--no-peak", "--json"]
            print(f"round {r + 1}/{a.rounds}, batch {b}: {' '.join(cmd)}", file=sys.stderr, flush=True)
            out = subprocess.run(cmd, capture_output=True, text=True)
            if out.returncode != 0:
                sys.exit(f"bench failed ({out.returncode}):\n{out.stderr}")
            runs[b].append(json.loads(out.stdout))
    first = runs[batches[0]][0]
    print(f"{first['config']}, {a.precision}, {first['device']}; {a.streams} vehicles, {a.rounds} round(s) of "
          f"{a.frames} timed step(s) each, medians over rounds")
    print(f"{'batch':>5} {'frames/s':>9} {'latency ms':>11} {'image/frame':>12} {'bev/frame':>10} {'bev vs 1':>9} "
          f"{'slot MiB':>9}")
    base_bev = statistics.median(x["parts_ms"]["bev"] for x in runs[1]) if 1 in runs else None
    rows = []
    for b in batches:
        fps = statistics.median(x["fps"] for x in runs[b])
        lat = statistics.median(x["median_ms"] for x in runs[b])
        img = statistics.median(x["parts_ms"]["image"] for x in runs[b])
        bev = statistics.median(x["parts_ms"]["bev"] for x in runs[b])
        slot = statistics.median(x["slot_mb"] for x in runs[b])
        ratio = bev / base_bev if base_bev else float("nan")
        rows.append({"batch": b, "fps": fps, "latency_ms": lat, "image_ms_per_frame": img, "bev_ms_per_frame": bev,
                     "bev_vs_batch1": ratio, "slot_mb": slot})
        print(f"{b:>5} {fps:>9.3f} {lat:>11.0f} {img:>12.0f} {bev:>10.0f} {ratio:>9.2f} {slot:>9.0f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rows": rows, "runs": {str(b): runs[b] for b in batches}}, f, indent=1)


if __name__ == "__main__":
    main()
