#!/usr/bin/env python3
"""bevformer.cpp's ResNet backbone against OpenVINO's on the same images, weights, threads and
precision, in one run: the CPU runtime an Intel user would pick instead, with its own AMX and VNNI
kernels (docs/PERF.md, "Against OpenVINO").

    VENV/bin/python scripts/compare_openvino.py [--config tiny] [--threads 2] [--frames 8] [--rounds 3]
        [--precisions f32,bf16,int8] [--bevformer build/bin/bevformer] [--json]

The venv: OpenVINO and NNCF from PyPI. The reference model is built and exported by Debian's
torch (python3-torch, scripts/setup.sh) in a /usr/bin/python3 subprocess: NNCF needs a newer torch
than Debian's 1.13 whenever it can import one, so the venv must not see the system's packages:

    python3 -m venv ~/ov-venv && ~/ov-venv/bin/pip install openvino nncf

How. `bevformer random-weights` writes seeded weights; the PyTorch reference (reference/) loads
them and its backbone (the ResNet: stem and layer1-4, every output level, as bevformer.cpp's
img.stem..img.layer4 stages) is exported to ONNX and read by OpenVINO. The images are the six
cameras of one frame at the config's padded size, N(0, 1) from --seed. OpenVINO compiles the
model for the CPU with INFERENCE_PRECISION_HINT f32 or bf16 and INFERENCE_NUM_THREADS = --threads
(latency hint); int8 is NNCF's post-training quantization of that model (per-channel weight
scales, activation ranges from --calib frames of images), compiled the same way. Each is run once
untimed, then --frames times; medians are reported. With --rounds R the two sides alternate R
times per precision (OpenVINO's --frames, then a `bevformer bench`) and the medians of the rounds
are reported with each round's ratio: the VMs here swing by up to 1.5x within minutes, which one
pass of each side would read as a difference between them. OpenVINO's f32 output is compared
with the reference's (relative L2 per level) so that both sides provably run the same network.

bevformer.cpp's side is `bevformer bench` at each precision with the same weights, threads and
--frames: the median of its image stage over the timed frames. That stage is the backbone plus the
FPN and the value projections (about 1% more work for tiny), so the ratio is slightly in
OpenVINO's favour; with --with-neck OpenVINO runs the backbone and the FPN, exported together
(in int8 NNCF may quantize the FPN's convs, which ours keeps in floats), and only the value
projections (0.2% of tiny's stage in bf16) are ours alone. Its int8 is calibrated first by
`bevformer calibrate` on --calib frames of the synthetic drive (N(0, 1) images, as NNCF's).
Exit status: 0, 77 when torch or openvino is missing (the venv above), 1 on a mismatch."""
# --export DIR (internal): run by /usr/bin/python3 with torch, writes DIR/backbone.onnx, the images
# (images.npy, calib.npy) and the reference backbone's outputs on the images (want.npz).

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SKIP = 77


def need(module, hint):
    try:
        return __import__(module)
    except ImportError as e:
        print(f"compare_openvino: {e}; {hint}", file=sys.stderr)
        sys.exit(SKIP)


def timed(fn, frames):
    fn()  # untimed: first-run allocations, kernel selection
    out = []
    for _ in range(frames):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1e3)
    return statistics.median(out)


def calibrate(binary, config, weights, threads, seed, calib, tmp):
    calibration = os.path.join(tmp, "calibration.json")
    c = subprocess.run([binary, "-q", "calibrate", "--config", config, "--weights", weights, "--threads",
                        str(threads), "--synthetic", str(calib), "--seed", str(seed), "-o", calibration],
                       stdout=sys.stderr)
    if c.returncode != 0:
        raise RuntimeError(f"bevformer calibrate exited {c.returncode}")
    return calibration


def ours(binary, config, weights, threads, frames, seed, precision, calibration):
    cmd = [binary, "bench", "--config", config, "--weights", weights, "--threads", str(threads), "--frames",
           str(frames), "--seed", str(seed), "--precision", precision, "--no-peak", "--json"]
    if calibration:
        cmd += ["--calibration", calibration]
    print("+ " + " ".join(cmd), file=sys.stderr, flush=True)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    if p.returncode != 0:  # e.g. int8 on a CPU without an exact int8 dot product (exit 2, said on stderr)
        raise RuntimeError(f"bevformer bench exited {p.returncode}")
    j = json.loads(p.stdout)
    return j["parts_ms"]["image"], j["device"]


def what(args):
    return "backbone and FPN" if args.with_neck else "backbone"


def export_backbone(args):
    """The torch side (Debian's python3-torch): the reference backbone with the seeded weights,
    exported to ONNX, and its outputs on the images."""
    sys.path.insert(0, os.path.join(ROOT, "reference"))
    import _bootstrap
    _bootstrap.ensure_torch()
    import numpy as np
    import torch
    import bevformer_ref as bf

    torch.set_num_threads(args.threads)
    cfg = bf.load_config(args.config)
    w, h = cfg.image.padded_wh()
    shape = (cfg.transformer.num_cams, 3, h, w)
    gen = torch.Generator().manual_seed(args.seed)
    images = torch.randn(*shape, generator=gen)
    calib = torch.stack([torch.randn(*shape, generator=gen) for _ in range(args.calib)])
    model = bf.build(cfg, args.weights)
    backbone = model.img_backbone.eval()
    if args.with_neck:
        class ImageFeatures(torch.nn.Module):  # the backbone's levels through the FPN
            def __init__(self):
                super().__init__()
                self.img_backbone, self.img_neck = model.img_backbone, model.img_neck

            def forward(self, img):
                return tuple(self.img_neck(self.img_backbone(img)))

        backbone = ImageFeatures().eval()
    with torch.inference_mode():
        want = [t.numpy() for t in backbone(images)]
    names = [f"level{i}" for i in range(len(want))]
    print(f"compare_openvino: exporting the {cfg.name} {what(args)} ({'x'.join(map(str, shape))}) to ONNX",
          file=sys.stderr, flush=True)
    with torch.no_grad():
        torch.onnx.export(backbone, (images,), os.path.join(args.export, "backbone.onnx"), input_names=["img"],
                          output_names=names, opset_version=13)
    np.save(os.path.join(args.export, "images.npy"), images.numpy())
    np.save(os.path.join(args.export, "calib.npy"), calib.numpy())
    np.savez(os.path.join(args.export, "want.npz"), *want)
    json.dump({"config": cfg.name, "shape": list(shape)}, open(os.path.join(args.export, "meta.json"), "w"))
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="tiny", help="tiny | small | base | upstream-style config JSON (default tiny)")
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="threads for both (default: all CPUs)")
    ap.add_argument("--frames", type=int, default=8, help="timed backbone runs each (default 8)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="rounds per precision, each OpenVINO's --frames then ours, alternating so that a VM's "
                         "swings hit both; medians over rounds (default 1)")
    ap.add_argument("--calib", type=int, default=4, help="frames of images NNCF calibrates int8 on (default 4)")
    ap.add_argument("--seed", type=int, default=2026, help="weights and images (default 2026)")
    ap.add_argument("--precisions", default="f32,bf16,int8", help="comma-separated, of f32, bf16, int8")
    ap.add_argument("--bevformer", default=os.path.join(ROOT, "build", "bin", "bevformer"), help="the CLI binary")
    ap.add_argument("--with-neck", action="store_true",
                    help="OpenVINO runs the backbone and the FPN (our image stage less its value projections)")
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout")
    ap.add_argument("--export", help=argparse.SUPPRESS)
    ap.add_argument("--weights", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.export:
        return export_backbone(args)
    precisions = [p for p in args.precisions.split(",") if p]
    if not precisions or any(p not in ("f32", "bf16", "int8") for p in precisions):
        ap.error("--precisions takes f32, bf16 and int8, comma-separated")
    if args.threads < 1 or args.frames < 1 or args.calib < 1 or args.rounds < 1:
        ap.error("--threads, --frames, --calib and --rounds must be >= 1")
    if not os.access(args.bevformer, os.X_OK):
        ap.error(f"{args.bevformer} is not an executable; build first (scripts/build.sh build) or pass --bevformer")
    if not os.path.exists("/usr/bin/python3"):
        print("compare_openvino: /usr/bin/python3 (with python3-torch) not found", file=sys.stderr)
        return SKIP
    ov = need("openvino", "pip install openvino nncf in a venv (this script's docstring)")
    import numpy as np

    rows = []
    with tempfile.TemporaryDirectory(prefix="bevformer-openvino-") as tmp:
        weights = os.path.join(tmp, "weights.safetensors")
        subprocess.run([args.bevformer, "-q", "random-weights", "--config", args.config, "--seed", str(args.seed),
                        "-o", weights], check=True, stdout=sys.stderr)  # stdout is the report's
        export = ["/usr/bin/python3", "-B", os.path.abspath(__file__), "--export", tmp, "--config", args.config,
                  "--weights", weights, "--seed", str(args.seed), "--calib", str(args.calib), "--threads",
                  str(args.threads)] + (["--with-neck"] if args.with_neck else [])
        print("+ " + " ".join(export), file=sys.stderr, flush=True)
        p = subprocess.run(export, stdout=sys.stderr)  # stdout is the report's
        if p.returncode != 0:
            return p.returncode
        meta = json.load(open(os.path.join(tmp, "meta.json")))
        shape, name = meta["shape"], meta["config"]
        w, h = shape[3], shape[2]
        feed = np.load(os.path.join(tmp, "images.npy"))
        want = list(np.load(os.path.join(tmp, "want.npz")).values())
        onnx_path = os.path.join(tmp, "backbone.onnx")
        core = ov.Core()
        model = core.read_model(onnx_path)
        cpu = core.get_property("CPU", "FULL_DEVICE_NAME")
        caps = core.get_property("CPU", "OPTIMIZATION_CAPABILITIES")

        def compile_for(m, hint):
            return core.compile_model(m, "CPU", {"INFERENCE_PRECISION_HINT": hint, "INFERENCE_NUM_THREADS": args.threads,
                                                 "PERFORMANCE_HINT": "LATENCY"})

        # The same network on both sides, whatever --precisions: OpenVINO's f32 output against the
        # reference's.
        checked = compile_for(model, "f32")
        got = checked.create_infer_request().infer({0: feed})
        fidelity = []
        for i, ref in enumerate(want):
            out = got[checked.outputs[i]]
            fidelity.append(float(np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-30)))
        del checked
        if max(fidelity) > 1e-3:
            print(f"compare_openvino: OpenVINO's f32 backbone differs from the reference's (relative L2 per "
                  f"level {fidelity}): not the same network", file=sys.stderr)
            return 1
        for prec in precisions:
            row = {"precision": prec}
            if prec == "int8":
                calib = list(np.load(os.path.join(tmp, "calib.npy")))
                print(f"compare_openvino: NNCF int8 calibration on {args.calib} frame(s)", file=sys.stderr, flush=True)
                with contextlib.redirect_stdout(sys.stderr):  # NNCF logs and draws progress on stdout
                    nncf = need("nncf", "pip install nncf in the venv (this script's docstring)")
                    qmodel = nncf.quantize(model, nncf.Dataset(calib), subset_size=args.calib)
            try:
                # int8: int8 where NNCF quantized, f32 elsewhere
                compiled = compile_for(qmodel if prec == "int8" else model, "f32" if prec == "int8" else prec)
                request = compiled.create_infer_request()
            except RuntimeError as e:  # OpenVINO refuses some graphs at some precisions: say so, go on
                request = None
                row["openvino_error"] = str(e).strip().splitlines()[-1][:300]
                print(f"compare_openvino: OpenVINO {prec}: {row['openvino_error']}", file=sys.stderr)
            calibration = None
            try:
                if prec == "int8":
                    calibration = calibrate(args.bevformer, args.config, weights, args.threads, args.seed, args.calib,
                                            tmp)
            except RuntimeError as e:
                row["bevformer_error"] = str(e)
                print(f"compare_openvino: bevformer.cpp {prec}: {e}", file=sys.stderr)
            theirs, mine = [], []
            for _ in range(args.rounds):
                if request is not None:
                    theirs.append(timed(lambda: request.infer({0: feed}), args.frames))
                if "bevformer_error" in row:
                    continue
                try:
                    ms, row["device"] = ours(args.bevformer, args.config, weights, args.threads, args.frames,
                                             args.seed, prec, calibration)
                    mine.append(ms)
                except RuntimeError as e:  # say so in the row, go on with the other precisions
                    row["bevformer_error"] = str(e)
                    print(f"compare_openvino: bevformer.cpp {prec}: {e}", file=sys.stderr)
            if theirs:
                row["openvino_ms"], row["openvino_rounds_ms"] = statistics.median(theirs), theirs
            if mine and "bevformer_error" not in row:
                row["bevformer_ms"], row["bevformer_rounds_ms"] = statistics.median(mine), mine
            if "openvino_ms" in row and "bevformer_ms" in row:
                row["ratio"] = row["openvino_ms"] / row["bevformer_ms"]
                row["ratio_rounds"] = [t / m for t, m in zip(theirs, mine)]
            rows.append(row)

    out = {"config": name, "openvino_runs": what(args), "threads": args.threads, "frames": args.frames,
           "rounds": args.rounds, "seed": args.seed, "images": list(shape),
           "openvino": ov.__version__ if hasattr(ov, "__version__") else ov.get_version(),
           "cpu": cpu, "openvino_capabilities": list(caps), "f32_relative_l2_per_level": fidelity, "rows": rows}
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    print(f"{name} {what(args)} on {shape[0]} images of {w}x{h}, {args.threads} thread(s), median of {args.frames}"
          f"{f' in each of {args.rounds} alternating rounds, median of the rounds' if args.rounds > 1 else ''}; "
          f"OpenVINO {out['openvino']} on {cpu} ({', '.join(caps)})")
    if fidelity:
        print("OpenVINO f32 against the reference, relative L2 per level: " + ", ".join(f"{e:.1e}" for e in fidelity))
    print(f"{'precision':10} {'bevformer ms':>13} {'OpenVINO ms':>12}  bevformer.cpp is")
    for r in rows:
        ours_ms = f"{r['bevformer_ms']:13.1f}" if "bevformer_ms" in r else f"{'(none)':>13}"
        verdict = f"{r['ratio']:.2f}x as fast" if "ratio" in r else "-"
        theirs = f"{r['openvino_ms']:12.1f}" if "openvino_ms" in r else f"{'(failed)':>12}"
        spread = ""
        if len(r.get("ratio_rounds", [])) > 1:
            spread = f" (rounds {min(r['ratio_rounds']):.2f}-{max(r['ratio_rounds']):.2f}x)"
        print(f"{r['precision']:10} {ours_ms} {theirs}  {verdict}{spread}" +
              (f"  OpenVINO: {r['openvino_error']}" if "openvino_error" in r else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
