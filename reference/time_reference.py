#!/usr/bin/env python3
"""Times the PyTorch reference on full-size synthetic frames: the PyTorch half of the
reference-vs-bevformer.cpp comparison (same config, threads and weights).

    python3 reference/time_reference.py --config tiny --weights /tmp/tiny.safetensors \
        --threads 2 --frames 5 [--warmup 2] [--precision f32|bf16] [--json]

Frames are random N(0, 1) normalized images of the config's padded size (zero padding) on the
six-camera rig of bevformer.cpp's synthetic frames, one scene with the ego moving and turning,
so every timed frame uses the history (TSA on the rotated previous BEV). The first --warmup
frames (the first has no history) are not timed. Frame latency is the whole forward_test of one
frame (backbone, neck, encoder, decoder, heads, top-k decode); the per-rig point sampling is
computed once, on the first frame, as bevformer.cpp caches it. The backbone (the ResNet alone,
where torch uses oneDNN convolutions) is timed separately on the same inputs, --frames times.

--precision bf16 runs as a PyTorch user would on a CPU with bf16 units: the model and its inputs
in channels-last memory format, every frame under torch.autocast("cpu", dtype=torch.bfloat16)
(convolutions and matmuls in bf16); layer norm and grid_sample run in f32 (torch 1.13's CPU
autocast has no rule for them and refuses a bf16 input with f32 weights or grid, so they get the
cast a user would add), and the history BEV is kept in f32 between frames, as bevformer.cpp keeps
it.

Prints median and p90 (numpy linear percentile) frame latency and the backbone median; with
--json, one JSON object on stdout instead:
{median_ms, p90_ms, backbone_median_ms, threads, torch_version, config, frames, warmup, malloc,
precision}.

By default the script re-runs itself with glibc malloc tunables that keep freed memory for reuse
(see _TUNABLES below); --default-malloc times glibc's out-of-the-box behaviour instead."""

import argparse
import json
import os
import sys
import time

import _bootstrap

# glibc serves every buffer over 32 MB (most activations here) with a fresh mmap and unmaps it on
# free, so each frame page-faults its whole working set in again (2.1 million faults, half the
# CPU time of tiny's ResNet). Unless --default-malloc is given, re-run with malloc kept on the
# heap and never trimmed, so freed buffers are reused: the effect of the jemalloc / tcmalloc
# that PyTorch's CPU tuning guide recommends. The tunables are read at process start.
_TUNABLES = "glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=68719476736"
if "--default-malloc" not in sys.argv and "glibc.malloc.mmap_max" not in os.environ.get("GLIBC_TUNABLES", ""):
    os.environ["GLIBC_TUNABLES"] = ":".join(x for x in (os.environ.get("GLIBC_TUNABLES"), _TUNABLES) if x)
    os.execv(sys.executable, [sys.executable, "-B"] + sys.argv)

_bootstrap.ensure_torch()

import numpy as np  # noqa: E402
import torch  # noqa: E402

import bevformer_ref as bf  # noqa: E402
from bevformer_ref.synthetic import synthetic_frame, synthetic_rig  # noqa: E402


def run_in_f32(name):
    """torch.nn.functional.<name> with its bf16 tensor arguments cast to f32 first."""
    import torch.nn.functional as F
    fn = getattr(F, name)

    def f32(*args, **kwargs):
        up = lambda a: a.float() if isinstance(a, torch.Tensor) and a.dtype == torch.bfloat16 else a  # noqa: E731
        return fn(*[up(a) for a in args], **{k: up(v) for k, v in kwargs.items()})

    setattr(F, name, f32)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True, help="tiny | small | base | path of an upstream-style config JSON")
    ap.add_argument("--weights", required=True, help=".safetensors (e.g. bevformer random-weights) or .pth")
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--frames", type=int, default=5, help="timed frames (default 5)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed frames first (default 2, at least 2)")
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--precision", default="f32", choices=["f32", "bf16"],
                    help="f32, or bf16 through torch.autocast with channels-last (default f32)")
    ap.add_argument("--default-malloc", action="store_true",
                    help="keep glibc's default malloc (fresh mmap + page faults for every large tensor)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.threads < 1 or args.frames < 1:
        ap.error("--threads and --frames must be >= 1")
    warmup = max(args.warmup, 2)  # frame 0 has no history; frame 1 is the first with it
    torch.set_num_threads(args.threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    log = (lambda *a: print(*a, file=sys.stderr)) if args.json else print

    cfg = bf.load_config(args.config)
    t0 = time.perf_counter()
    model = bf.build(cfg, args.weights)
    log(f"reference: {cfg.name}, weights {args.weights} loaded in {time.perf_counter() - t0:.1f} s; "
        f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), "
        f"input {cfg.transformer.num_cams}x3x{cfg.image.padded_wh()[1]}x{cfg.image.padded_wh()[0]}; "
        f"malloc: {'glibc default' if args.default_malloc else 'heap reuse'}; {args.precision}")
    bf16 = args.precision == "bf16"
    if bf16:
        model = model.to(memory_format=torch.channels_last)
        run_in_f32("layer_norm")
        run_in_f32("grid_sample")

    def autocast():
        return torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16)

    gen = torch.Generator().manual_seed(args.seed)
    rig = synthetic_rig(cfg)
    frame_ms, used_history = [], []
    last = None
    with torch.inference_mode():
        for i in range(warmup + args.frames):
            f = synthetic_frame(cfg, i, gen, rig)
            if bf16:
                f.img = f.img.contiguous(memory_format=torch.channels_last)
            had_prev = model.history.prev_bev is not None and model.history.scene_token == f.scene_token
            t = time.perf_counter()
            with autocast():
                dets = model.forward_frame(f)
            if bf16 and model.history.prev_bev is not None:
                model.history.prev_bev = model.history.prev_bev.float()
            ms = (time.perf_counter() - t) * 1e3
            last = f
            if i >= warmup:
                frame_ms.append(ms)
                used_history.append(had_prev)
            log(f"  frame {i}: {ms:9.1f} ms{'' if i >= warmup else ' (warm-up)'}"
                f"{'' if had_prev else ' (no history)'}, {len(dets['det.scores_3d'])} detections")
        if not all(used_history):
            raise SystemExit("reference: a timed frame ran without history")
        if not torch.isfinite(model.history.prev_bev).all():
            log("reference: warning: non-finite BEV features (weights?)")
        backbone_ms = []
        with autocast():
            model.img_backbone(last.img)  # one untimed run
        for _ in range(args.frames):
            t = time.perf_counter()
            with autocast():
                model.img_backbone(last.img)
            backbone_ms.append((time.perf_counter() - t) * 1e3)

    out = {
        "median_ms": float(np.median(frame_ms)),
        "p90_ms": float(np.percentile(frame_ms, 90)),
        "backbone_median_ms": float(np.median(backbone_ms)),
        "threads": torch.get_num_threads(),
        "torch_version": torch.__version__,
        "config": cfg.name,
        "frames": args.frames,
        "warmup": warmup,
        "malloc": "glibc default" if args.default_malloc else "glibc heap reuse (" + _TUNABLES + ")",
        "precision": args.precision,
    }
    if args.json:
        print(json.dumps(out))
    else:
        print(f"frame latency: median {out['median_ms']:.1f} ms, p90 {out['p90_ms']:.1f} ms "
              f"over {args.frames} frame(s) with history")
        print(f"backbone (ResNet alone): median {out['backbone_median_ms']:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
