#!/usr/bin/env python3
"""Runs every frame of a golden set through the PyTorch reference, in order with history, and
compares every stage tensor the set stores (relative L2 <= 1e-4; integer tensors exactly;
detections as a set keyed by (query_index, label)). Prints a per-stage table.

    python3 reference/test_golden.py shared/golden/micro [--tol 1e-4] [--weights pth|safetensors]

Exit status: 0 all stages agree, 1 something differs, 77 torch is not installed (skip)."""

import argparse
import glob
import json
import os
import re
import sys

import _bootstrap

_bootstrap.ensure_torch()

import numpy as np  # noqa: E402
import torch  # noqa: E402

import bevformer_ref as bf  # noqa: E402

DET_KEYS = ("det.boxes_3d", "det.scores_3d", "det.labels_3d", "det.query_index")


def rel_l2(ours: np.ndarray, ref: np.ndarray) -> float:
    a, b = ours.astype(np.float64).ravel(), ref.astype(np.float64).ravel()
    if not np.all(np.isfinite(a)):
        return float("inf")
    den = np.linalg.norm(b)
    num = np.linalg.norm(a - b)
    return float(num / den) if den > 0 else float(num)


def compare_detections(ours, ref, tol):
    """Set of (query, label) must match; matched boxes and scores within rel L2 tol."""
    def keyed(d):
        q, l = d["det.query_index"].astype(np.int64), d["det.labels_3d"].astype(np.int64)
        return {(int(a), int(b)): i for i, (a, b) in enumerate(zip(q, l))}
    ko, kr = keyed(ours), keyed(ref)
    only_ours, only_ref = sorted(set(ko) - set(kr)), sorted(set(kr) - set(ko))
    common = sorted(set(ko) & set(kr))
    io = np.array([ko[k] for k in common], dtype=np.int64)
    ir = np.array([kr[k] for k in common], dtype=np.int64)
    box = rel_l2(ours["det.boxes_3d"][io], ref["det.boxes_3d"][ir]) if common else 0.0
    score = rel_l2(ours["det.scores_3d"][io], ref["det.scores_3d"][ir]) if common else 0.0
    max_box = float(np.abs(ours["det.boxes_3d"][io].astype(np.float64) - ref["det.boxes_3d"][ir]).max()) if common else 0.0
    ok = not only_ours and not only_ref and box <= tol and score <= tol
    return ok, {"n_ref": len(kr), "n_ours": len(ko), "only_ours": only_ours[:5], "only_ref": only_ref[:5],
                "boxes_rel_l2": box, "scores_rel_l2": score, "boxes_max_abs": max_box}


def load_frame(golden_dir, k, cfg, stored):
    with open(os.path.join(golden_dir, f"frame{k}_meta.json")) as f:
        meta = json.load(f)
    files = [os.path.join(golden_dir, p) for p in meta.get("img_filenames", [])]
    if files and all(os.path.exists(p) for p in files):
        img, _ = bf.preprocess([bf.read_png_rgb(p) for p in files], cfg)
        source = "png"
    else:
        img, source = torch.from_numpy(np.array(stored["img"])), "stored img"
    frame = bf.Frame(img=img, lidar2img=np.array(meta["lidar2img"], dtype=np.float64),
                     can_bus=np.array(meta["can_bus"], dtype=np.float64), scene_token=meta["scene_token"])
    return frame, source


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("golden_dir")
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--weights", choices=("pth", "safetensors"), default=None,
                    help="which weight file of the set to run (default: checkpoint.pth when present)")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    d = args.golden_dir
    cfg = bf.load_config(os.path.join(d, "config.json"))
    pth, st = os.path.join(d, "checkpoint.pth"), os.path.join(d, "weights.safetensors")
    choice = args.weights or ("pth" if os.path.exists(pth) else "safetensors")
    weights = pth if choice == "pth" else st
    model = bf.build(cfg, weights)
    failures = []

    # The two weight files of a set must hold the same tensors.
    if os.path.exists(pth) and os.path.exists(st):
        a, _ = bf.load_state_dict(pth)
        b, _ = bf.load_state_dict(st)
        diff = sorted(set(a) ^ set(b)) + [k for k in set(a) & set(b) if not torch.equal(a[k], b[k].to(a[k].dtype))]
        print(f"weights: checkpoint.pth and weights.safetensors: {len(a)} tensors, "
              f"{'identical' if not diff else f'{len(diff)} differ, e.g. {diff[:3]}'}")
        if diff:
            failures.append("weight files differ")
    print(f"weights: running {os.path.basename(weights)}; torch {torch.__version__}, {args.threads} thread(s)")

    frames = sorted((int(re.search(r"frame(\d+)\.safetensors$", p).group(1)), p)
                    for p in glob.glob(os.path.join(d, "frame*.safetensors")))
    if not frames:
        print(f"no frame<k>.safetensors in {d}")
        return 1
    table = {}  # stage -> {frame: (value, ok, kind)}
    det_rows = []
    for k, path in frames:
        ref = bf.read_safetensors(path)
        frame, source = load_frame(d, k, cfg, ref)
        taps = {}
        model.forward_frame(frame, taps)
        ours = {n: t.detach().cpu().numpy() for n, t in taps.items()}
        for name, r in ref.items():
            if name in DET_KEYS:
                continue
            row = table.setdefault(name, {})
            if name not in ours:
                row[k] = (None, False, "missing")
                failures.append(f"frame {k} {name}: not produced")
                continue
            o = ours[name]
            if tuple(o.shape) != tuple(r.shape):
                row[k] = (None, False, f"shape {list(o.shape)} vs {list(r.shape)}")
                failures.append(f"frame {k} {name}: shape {list(o.shape)}, golden {list(r.shape)}")
                continue
            if np.issubdtype(r.dtype, np.floating):
                v = rel_l2(o, r)
                ok = v <= args.tol
                row[k] = (v, ok, "rel_l2")
            else:
                v = int(np.count_nonzero(o.astype(np.int64) != r.astype(np.int64)))
                ok = v == 0
                row[k] = (v, ok, "mismatches")
            if not ok:
                failures.append(f"frame {k} {name}: {row[k][2]} {v}")
        if all(n in ref for n in DET_KEYS):
            ok, info = compare_detections(ours, ref, args.tol)
            det_rows.append((k, ok, info, source))
            if not ok:
                failures.append(f"frame {k} detections: {info}")

    ks = [k for k, _ in frames]
    print()
    print(f"{'stage':28s}" + "".join(f"{'frame ' + str(k):>13s}" for k in ks) + f"{'worst':>13s}  ok")
    for name in sorted(table, key=_stage_order):
        row = table[name]
        cells, worst, all_ok = [], None, True
        for k in ks:
            if k not in row:
                cells.append(f"{'-':>13s}")
                continue
            v, ok, kind = row[k]
            all_ok &= ok
            if v is None:
                cells.append(f"{kind[:12]:>13s}")
                continue
            cells.append(f"{v:13.2e}" if kind == "rel_l2" else f"{v:>13d}")
            worst = v if worst is None else max(worst, v)
        w = "" if worst is None else (f"{worst:13.2e}" if isinstance(worst, float) else f"{worst:>13d}")
        print(f"{name:28s}" + "".join(cells) + f"{w:>13s}  {'yes' if all_ok else 'NO'}")
    print()
    for k, ok, info, source in det_rows:
        print(f"frame {k} detections ({info['n_ref']} golden, {info['n_ours']} ours; input from {source}): "
              f"(query, label) set {'equal' if not info['only_ours'] and not info['only_ref'] else 'DIFFERS'}, "
              f"boxes rel L2 {info['boxes_rel_l2']:.2e} (max |d| {info['boxes_max_abs']:.2e}), "
              f"scores rel L2 {info['scores_rel_l2']:.2e}  {'ok' if ok else 'FAIL'}")
    print()
    if failures:
        print(f"FAIL: {len(failures)} problem(s), tolerance rel L2 {args.tol:g}")
        for f in failures[:30]:
            print("  " + f)
        return 1
    print(f"PASS: {len(table)} stage tensors x {len(ks)} frames and the detections agree (rel L2 <= {args.tol:g})")
    return 0


def _stage_order(name):
    order = ["img", "backbone", "neck", "dbg.spatial", "dbg.level", "dbg.reference", "dbg.bev_mask",
             "dbg.can_bus", "dbg.shift", "dbg.prev_bev", "dbg.bev_pos", "dbg.bev_query", "dbg.enc_layer",
             "bev_embed", "dbg.init", "dbg.inter_states", "dbg.inter_ref", "all_cls", "all_bbox"]
    for i, p in enumerate(order):
        if name.startswith(p):
            return (i, name)
    return (len(order), name)


if __name__ == "__main__":
    sys.exit(main())
