#!/usr/bin/env python3
"""`bevformer eval` against the official nuScenes devkit's own code, on random cases full of the
devkit's edge cases: exact-threshold centre distances, boxes at the edge of a class's range,
bicycles and motorcycles in bike racks, GT with 0 points, NaN GT velocities, score ties across
samples, non-unit and negated quaternions, classes without GT and predictions without GT, several
samples in a scene of random ego poses. Every number of metrics_summary.json is compared (112 per
case); the first difference over --tol fails the run and keeps the case for a look.

The devkit side is `DetectionEval.evaluate` of nuscenes-devkit (PyPI) over the devkit's own
load_prediction, add_center_dist and filter_eval_boxes, with a stand-in for the database that
serves the sample, sample_data, ego_pose and bike-rack annotation records of the case (what those
functions read); the GT boxes are DetectionBoxes made from gt.json's fields, as the devkit's
load_gt makes them from the database.

Usage (the devkit in a virtual environment; docs/EVAL.md):
    python3 -m venv V && V/bin/pip install nuscenes-devkit
    V/bin/python scripts/compare_devkit.py build/bin/bevformer [--cases 200] [--seed 1] [--tol 1e-9] [--keep DIR]
"""
import argparse
import json
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile

import numpy as np
from nuscenes.eval.common.config import config_factory
from nuscenes.eval.common.loaders import add_center_dist, filter_eval_boxes, load_prediction
from nuscenes.eval.common.data_classes import EvalBoxes
from nuscenes.eval.detection.data_classes import DetectionBox
from nuscenes.eval.detection.evaluate import DetectionEval

CLASSES = ["car", "truck", "bus", "trailer", "construction_vehicle", "pedestrian", "motorcycle", "bicycle",
           "traffic_cone", "barrier"]
ATTRIBUTES = {
    "pedestrian": ["pedestrian.moving", "pedestrian.sitting_lying_down", "pedestrian.standing"],
    "bicycle": ["cycle.with_rider", "cycle.without_rider"],
    "motorcycle": ["cycle.with_rider", "cycle.without_rider"],
    "traffic_cone": [""],
    "barrier": [""],
}
VEHICLE = ["vehicle.moving", "vehicle.parked", "vehicle.stopped"]
ALL_ATTRIBUTES = sorted({a for v in ATTRIBUTES.values() for a in v if a} | set(VEHICLE))
RANGE = {"car": 50, "truck": 50, "bus": 50, "trailer": 50, "construction_vehicle": 50, "pedestrian": 40,
         "motorcycle": 40, "bicycle": 40, "traffic_cone": 30, "barrier": 30}


def yaw_quat(yaw, scale=1.0, negate=False):
    q = [math.cos(yaw / 2), 0.0, 0.0, math.sin(yaw / 2)]
    s = -scale if negate else scale
    return [s * c for c in q]


def make_case(rng):
    """(gt document, results document) of one random case."""
    n_samples = rng.randint(1, 6)
    present = rng.sample(CLASSES, rng.randint(1, len(CLASSES)))
    gt_samples, results = {}, {}
    for s in range(n_samples):
        token = f"sample-{s}-{rng.randrange(10**6)}"
        ego = [rng.uniform(-500, 500), rng.uniform(-500, 500), rng.uniform(0, 2)]
        boxes, racks, preds = [], [], []
        if rng.random() < 0.4:
            c = [ego[0] + rng.uniform(-20, 20), ego[1] + rng.uniform(-20, 20), 0.5]
            racks.append({"translation": c, "size": [2.0, 6.0, 1.2], "rotation": yaw_quat(rng.uniform(-3, 3))})
        for _ in range(rng.randint(0, 12)):
            cls = rng.choice(present)
            r = RANGE[cls]
            # Some at the range's edge (the filter keeps ego_dist < range), most inside it.
            if rng.random() < 0.1:
                d = r + rng.choice([-1e-9, 0.0, 1e-9, 0.5])
            else:
                d = rng.uniform(0, r + 5)
            a = rng.uniform(-math.pi, math.pi)
            t = [ego[0] + d * math.cos(a), ego[1] + d * math.sin(a), rng.uniform(-1, 3)]
            if cls in ("bicycle", "motorcycle") and racks and rng.random() < 0.5:
                t = [racks[0]["translation"][0] + rng.uniform(-0.5, 0.5), racks[0]["translation"][1] + rng.uniform(-0.5, 0.5), 0.5]
            size = [rng.uniform(0.3, 3), rng.uniform(0.3, 12), rng.uniform(0.5, 4)]
            yaw = rng.uniform(-math.pi, math.pi)
            vel = [None, None] if rng.random() < 0.15 else [rng.uniform(-15, 15), rng.uniform(-15, 15)]
            attr = rng.choice(ATTRIBUTES.get(cls, VEHICLE))
            if attr and rng.random() < 0.05:
                attr = ""  # an annotation without its attribute
            pts = 0 if rng.random() < 0.1 else rng.randint(1, 500)
            boxes.append({"translation": t, "size": size, "rotation": yaw_quat(yaw), "velocity": vel,
                          "detection_name": cls, "attribute_name": attr, "num_pts": pts})
            # Predictions of it: exact-threshold offsets, small noise, or none (a miss).
            for _ in range(rng.choice([0, 1, 1, 1, 2])):
                if rng.random() < 0.3:
                    off = rng.choice([0.5, 1.0, 2.0, 4.0]) * rng.choice([1.0, 1.0 + 1e-12, 1.0 - 1e-12])
                    dx, dy = off, 0.0
                else:
                    dx, dy = rng.gauss(0, 1.2), rng.gauss(0, 1.2)
                pv = [rng.uniform(-15, 15), rng.uniform(-15, 15)]
                pa = rng.choice(ALL_ATTRIBUTES) if cls not in ("traffic_cone", "barrier") else ""
                preds.append(pred(rng, token, [t[0] + dx, t[1] + dy, t[2] + rng.gauss(0, 0.3)],
                                  [x * rng.uniform(0.7, 1.3) for x in size], yaw + rng.gauss(0, 0.5), pv, cls, pa))
        for _ in range(rng.randint(0, 6)):  # false positives, some of classes without GT
            cls = rng.choice(CLASSES)
            d, a = rng.uniform(0, RANGE[cls] + 5), rng.uniform(-math.pi, math.pi)
            preds.append(pred(rng, token, [ego[0] + d * math.cos(a), ego[1] + d * math.sin(a), 1.0],
                              [1.0, 2.0, 1.5], rng.uniform(-3, 3), [0.0, 0.0], cls,
                              rng.choice(ALL_ATTRIBUTES) if cls not in ("traffic_cone", "barrier") else ""))
        rng.shuffle(preds)
        gt_samples[token] = {"ego_pose": {"translation": ego, "rotation": yaw_quat(rng.uniform(-3, 3))},
                             "bike_racks": racks, "boxes": boxes}
        results[token] = preds
    keys = list(results)
    rng.shuffle(keys)  # results in another order than the GT
    meta = {"use_camera": True, "use_lidar": False, "use_radar": False, "use_map": False, "use_external": False}
    return ({"format": "nuseval-gt-1", "description": "compare_devkit random case", "samples": gt_samples},
            {"meta": meta, "results": {k: results[k] for k in keys}})


def pred(rng, token, t, size, yaw, vel, cls, attr):
    scale = rng.choice([1.0, 1.0, 0.5, 2.0])
    score = rng.choice([0.1, 0.3, 0.5, 0.7, 0.9]) if rng.random() < 0.5 else rng.random()  # ties across samples
    return {"sample_token": token, "translation": t, "size": size,
            "rotation": yaw_quat(yaw, scale, negate=rng.random() < 0.2), "velocity": vel,
            "detection_name": cls, "detection_score": score, "attribute_name": attr}


class StandIn:
    """The records of the database that add_center_dist and filter_eval_boxes read."""

    def __init__(self, gt):
        self.records = {}
        for token, s in gt["samples"].items():
            anns = []
            for i, rack in enumerate(s.get("bike_racks", [])):
                ann = f"{token}-rack-{i}"
                self.records[("sample_annotation", ann)] = dict(rack, category_name="static_object.bicycle_rack")
                anns.append(ann)
            self.records[("sample", token)] = {"anns": anns, "data": {"LIDAR_TOP": f"{token}-lidar"}}
            self.records[("sample_data", f"{token}-lidar")] = {"ego_pose_token": f"{token}-pose"}
            self.records[("ego_pose", f"{token}-pose")] = s["ego_pose"]

    def get(self, table, token):
        return self.records[(table, token)]


def devkit_metrics(gt, results_path, cfg):
    nusc = StandIn(gt)
    pred_boxes, meta = load_prediction(results_path, cfg.max_boxes_per_sample, DetectionBox, verbose=False)
    gt_boxes = EvalBoxes()
    for token, s in gt["samples"].items():
        boxes = []
        for b in s["boxes"]:
            vel = tuple(float("nan") if v is None else v for v in b["velocity"])
            boxes.append(DetectionBox(sample_token=token, translation=tuple(b["translation"]), size=tuple(b["size"]),
                                      rotation=tuple(b["rotation"]), velocity=vel, num_pts=b["num_pts"],
                                      detection_name=b["detection_name"], detection_score=-1.0,
                                      attribute_name=b["attribute_name"]))
        gt_boxes.add_boxes(token, boxes)
    assert set(pred_boxes.sample_tokens) == set(gt_boxes.sample_tokens)
    pred_boxes = add_center_dist(nusc, pred_boxes)
    gt_boxes = add_center_dist(nusc, gt_boxes)
    pred_boxes = filter_eval_boxes(nusc, pred_boxes, cfg.class_range, verbose=False)
    gt_boxes = filter_eval_boxes(nusc, gt_boxes, cfg.class_range, verbose=False)
    ev = DetectionEval.__new__(DetectionEval)  # the devkit's evaluate() over these boxes
    ev.cfg, ev.pred_boxes, ev.gt_boxes, ev.meta, ev.verbose = cfg, pred_boxes, gt_boxes, meta, False
    ev.sample_tokens = gt_boxes.sample_tokens
    metrics, _ = ev.evaluate()
    return metrics.serialize()


def numbers(d, prefix=""):
    """Every number of a metrics_summary object, by path (None and NaN as NaN)."""
    out = {}
    for k, v in d.items():
        if k in ("cfg", "meta", "eval_time"):
            continue
        if isinstance(v, dict):
            out.update(numbers(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = float("nan") if v is None else float(v)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bevformer")
    ap.add_argument("--cases", type=int, default=200)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--tol", type=float, default=1e-9)
    ap.add_argument("--keep", help="folder for a failing case (default: a temporary folder, printed)")
    a = ap.parse_args()
    cfg = config_factory("detection_cvpr_2019")
    rng = random.Random(a.seed)
    work = tempfile.mkdtemp(prefix="compare-devkit-")
    worst, compared, boxes, maps = 0.0, 0, 0, []
    try:
        for case in range(a.cases):
            gt, res = make_case(rng)
            while not any(s["boxes"] for s in gt["samples"].values()) or not any(res["results"].values()):
                gt, res = make_case(rng)  # the devkit's filter cannot tell the box type of no boxes at all
            gt_path, res_path = os.path.join(work, "gt.json"), os.path.join(work, "results_nusc.json")
            with open(gt_path, "w") as f:
                json.dump(gt, f)
            with open(res_path, "w") as f:
                json.dump(res, f)
            want = numbers(devkit_metrics(gt, res_path, cfg))
            run = subprocess.run([a.bevformer, "-q", "eval", "--results", res_path, "--gt", gt_path, "--json"],
                                 capture_output=True, text=True)
            if run.returncode != 0:
                raise SystemExit(f"case {case}: bevformer eval failed ({run.returncode}): {run.stderr.strip()}")
            got = numbers(json.loads(run.stdout))
            if set(got) != set(want):
                raise SystemExit(f"case {case}: other keys: {sorted(set(got) ^ set(want))}")
            for k, w in want.items():
                g = got[k]
                same = (math.isnan(g) and math.isnan(w)) or abs(g - w) <= a.tol
                if not same:
                    keep = a.keep or tempfile.mkdtemp(prefix="compare-devkit-case-")
                    os.makedirs(keep, exist_ok=True)
                    shutil.copy(gt_path, keep)
                    shutil.copy(res_path, keep)
                    raise SystemExit(f"case {case}: {k}: devkit {w!r}, bevformer {g!r} (the case: {keep})")
                if not math.isnan(w):
                    worst = max(worst, abs(g - w))
            compared += len(want)
            maps.append(want["mean_ap"])
            boxes += sum(len(s["boxes"]) for s in gt["samples"].values())
            if (case + 1) % 50 == 0:
                print(f"compare_devkit: {case + 1} of {a.cases} cases agree", file=sys.stderr)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"compare_devkit: {a.cases} random cases (seed {a.seed}, {boxes} GT boxes), {compared} numbers: "
          f"every one within {a.tol:g} of the devkit's (largest difference {worst:.3g}; NaN where the devkit has NaN); "
          f"devkit mAP {min(maps):.3f} to {max(maps):.3f}, median {sorted(maps)[len(maps) // 2]:.3f}")


if __name__ == "__main__":
    main()
