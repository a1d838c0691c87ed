#!/usr/bin/env python3
"""bevformer.cpp against the PyTorch reference, side by side, in one run: the same config, the
same seeded random weights (one safetensors file written by `bevformer random-weights`), the same
threads, the same synthetic six-camera drive (every timed frame uses the history). Prints both
medians and p90s, the ratio of the frames, and the ratio of the backbones alone (where torch
also runs oneDNN convolutions).

    python3 scripts/compare_reference.py [--config tiny] [--threads 2] [--frames 5] [--rounds 3]
        [--precision f32|bf16] [--torch-precision f32|bf16] [--bevformer build/bin/bevformer] [--json]

Both sides run at --precision unless --torch-precision says otherwise: bf16 is bevformer.cpp's
bf16 and the reference under torch.autocast (bf16) with channels-last, as a PyTorch user runs a
model on a CPU with bf16 units (reference/time_reference.py).

The two run one after the other, never at once, so neither slows the other. With --rounds R they
alternate R times (torch, ours, torch, ...) and the medians of the rounds are reported with each
round's ratio: the VMs here swing by 10-50% within minutes, which one pass of each side would
read as a difference between them. The torch side uses glibc malloc tunables that keep freed
buffers for reuse (see reference/time_reference.py); --default-malloc passes glibc's defaults
through instead. Exit status: 0, or 77 when torch is not installed (reference/README.md)."""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


BACKBONE = ("img.stem", "img.layer1", "img.layer2", "img.layer3", "img.layer4")


def run_json(cmd):
    print("+ " + " ".join(cmd), file=sys.stderr, flush=True)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    if p.returncode != 0:
        raise SystemExit(p.returncode)
    return json.loads(p.stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="tiny", help="tiny | small | base | upstream-style config JSON (default tiny)")
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="threads for both (default: all CPUs)")
    ap.add_argument("--frames", type=int, default=5, help="timed frames each (default 5)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="ours then torch, this many times; medians over rounds (default 1)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed frames first (default 2, at least 2)")
    ap.add_argument("--seed", type=int, default=2026, help="weights and frames (default 2026)")
    ap.add_argument("--precision", default="f32", choices=["f32", "bf16"], help="both sides' precision (default f32)")
    ap.add_argument("--torch-precision", choices=["f32", "bf16"],
                    help="the reference's precision when it differs from --precision")
    ap.add_argument("--bevformer", default=os.path.join(ROOT, "build", "bin", "bevformer"), help="the CLI binary")
    ap.add_argument("--default-malloc", action="store_true", help="torch with glibc's default malloc")
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = ap.parse_args()
    torch_precision = args.torch_precision or args.precision
    if not os.access(args.bevformer, os.X_OK):
        ap.error(f"{args.bevformer} is not an executable; build first (scripts/build.sh build) or pass --bevformer")
    if args.threads < 1 or args.frames < 1 or args.rounds < 1 or args.warmup < 2:
        ap.error("--threads, --frames and --rounds must be >= 1, --warmup >= 2")

    with tempfile.TemporaryDirectory(prefix="bevformer-compare-") as tmp:
        weights = os.path.join(tmp, "weights.safetensors")
        subprocess.run([args.bevformer, "-q", "random-weights", "--config", args.config, "--seed", str(args.seed),
                        "-o", weights], check=True, stdout=sys.stderr)  # stdout is the report's
        common = ["--config", args.config, "--weights", weights, "--threads", str(args.threads),
                  "--frames", str(args.frames), "--warmup", str(args.warmup), "--seed", str(args.seed)]
        torch_cmd = [sys.executable, os.path.join(ROOT, "reference", "time_reference.py"), *common,
                     "--precision", torch_precision, "--json"]
        if args.default_malloc:
            torch_cmd.append("--default-malloc")
        refs, benches = [], []  # one per round: time_reference's JSON, bench's
        for _ in range(args.rounds):
            # Ours first: a precision this CPU lacks is refused there (exit 2, saying what it lacks)
            # before the reference spends a run on it.
            benches.append(run_json([args.bevformer, "bench", *common, "--precision", args.precision, "--no-peak",
                                     "--json"]))
            print("+ " + " ".join(torch_cmd), file=sys.stderr, flush=True)
            p = subprocess.run(torch_cmd, stdout=subprocess.PIPE, text=True)
            if p.returncode == 77:
                print("compare: torch is not installed (reference/README.md); nothing to compare", file=sys.stderr)
                return 77
            if p.returncode != 0:
                return p.returncode
            refs.append(json.loads(p.stdout))

    median = statistics.median
    ours, ref = benches[0], refs[0]  # for what every round reports alike
    backbone = median(sum(s["ms"] for s in b["stages"] if s["name"] in BACKBONE) for b in benches)
    ref_backbone = median(r["backbone_median_ms"] for r in refs)
    out = {
        "config": ours["config"], "threads": args.threads, "frames": args.frames, "rounds": args.rounds,
        "seed": args.seed,
        # Each side's precision as it reports it, not as asked. With rounds: medians of the rounds.
        "bevformer": {"median_ms": median(b["median_ms"] for b in benches),
                      "p90_ms": median(b["p90_ms"] for b in benches), "backbone_ms": backbone,
                      "precision": ours["precision"], "device": ours["device"]},
        "pytorch": {"median_ms": median(r["median_ms"] for r in refs), "p90_ms": median(r["p90_ms"] for r in refs),
                    "backbone_ms": ref_backbone, "torch_version": ref["torch_version"], "malloc": ref["malloc"],
                    "precision": ref["precision"]},
        "ratio_frame_rounds": [r["median_ms"] / b["median_ms"] for r, b in zip(refs, benches)],
    }
    out["ratio_frame"] = out["pytorch"]["median_ms"] / out["bevformer"]["median_ms"]
    out["ratio_backbone"] = ref_backbone / backbone if backbone > 0 else None
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    b, t = out["bevformer"], out["pytorch"]
    print(f"{out['config']}, {args.threads} thread(s), {args.frames} timed frames after {args.warmup}, seed {args.seed}"
          + (f", medians of {args.rounds} alternating rounds" if args.rounds > 1 else ""))
    print(f"{'':12} {'median ms':>10} {'p90 ms':>10} {'backbone ms':>12}")
    print(f"{'bevformer':12} {b['median_ms']:10.1f} {b['p90_ms']:10.1f} {b['backbone_ms']:12.1f}   ({b['precision']})")
    print(f"{'pytorch':12} {t['median_ms']:10.1f} {t['p90_ms']:10.1f} {t['backbone_ms']:12.1f}   "
          f"(torch {t['torch_version']}, {'bf16 autocast, channels-last' if t['precision'] == 'bf16' else 'f32'})")
    spread = out["ratio_frame_rounds"]
    print(f"bevformer.cpp is {out['ratio_frame']:.2f}x faster per frame"
          + (f" (rounds {min(spread):.2f}-{max(spread):.2f}x)" if len(spread) > 1 else "")
          + (f", {out['ratio_backbone']:.2f}x on the backbone alone" if out["ratio_backbone"] else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
