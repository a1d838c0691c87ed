#!/usr/bin/env python3
"""A synthetic val-sized evaluation input, to time `bevformer eval` at dataset scale (docs/EVAL.md).

    python3 scripts/synthetic_eval.py OUT_DIR [SAMPLES=6019] [GT_PER_SAMPLE=25] [PRED_PER_SAMPLE=300]

Writes OUT_DIR/gt.json (nuseval-gt-1) and OUT_DIR/results_nusc.json: SAMPLES samples with
GT_PER_SAMPLE boxes of all 10 classes around the ego and PRED_PER_SAMPLE predictions each (BEVFormer
keeps 300 per frame): noisy copies of the GT with falling scores, then false positives. Seeded, so
every run writes the same files. The numbers it evaluates to mean nothing; only the time does."""

import math
import os
import random
import sys

NAMES = ["car", "truck", "bus", "trailer", "construction_vehicle", "pedestrian", "motorcycle", "bicycle",
         "traffic_cone", "barrier"]
ATTRS = {"car": "vehicle.parked", "truck": "vehicle.moving", "bus": "vehicle.moving", "trailer": "vehicle.parked",
         "construction_vehicle": "vehicle.parked", "pedestrian": "pedestrian.moving", "motorcycle": "cycle.with_rider",
         "bicycle": "cycle.without_rider", "traffic_cone": "", "barrier": ""}


def box(x, y, name, yaw, v, extra):
    q = f"[{math.cos(yaw / 2):.6f}, 0.0, 0.0, {math.sin(yaw / 2):.6f}]"
    return (f'{{{extra}"translation": [{x:.3f}, {y:.3f}, 1.0], "size": [1.9, 4.6, 1.7], "rotation": {q}, '
            f'"velocity": [{v[0]:.3f}, {v[1]:.3f}], "detection_name": "{name}", "attribute_name": "{ATTRS[name]}"')


def main():
    out = sys.argv[1]
    given, defaults = sys.argv[2:], [6019, 25, 300]
    samples, gt_n, pred_n = (int(given[i]) if i < len(given) else defaults[i] for i in range(3))
    os.makedirs(out, exist_ok=True)
    rng = random.Random(0)
    with open(f"{out}/gt.json", "w") as g, open(f"{out}/results_nusc.json", "w") as r:
        g.write('{"format": "nuseval-gt-1", "description": "synthetic", "samples": {\n')
        r.write('{"meta": {"use_camera": true, "use_lidar": false, "use_radar": false, "use_map": false, '
                '"use_external": false}, "results": {\n')
        for s in range(samples):
            token = f"synthetic-{s:05d}"
            ex, ey = 1000.0 + 3 * s, 500.0
            gts = []
            for _ in range(gt_n):
                a, d = rng.uniform(0, 2 * math.pi), rng.uniform(1, 55)
                gts.append((ex + d * math.cos(a), ey + d * math.sin(a), rng.choice(NAMES), rng.uniform(-3, 3),
                            (rng.uniform(-3, 3), rng.uniform(-3, 3))))
            gt_lines = [box(*b, "") + f', "num_pts": {rng.choice([0, 3, 20, 80])}}}' for b in gts]
            g.write(("," if s else "") + f'"{token}": {{"ego_pose": {{"translation": [{ex}, {ey}, 0.0], '
                    f'"rotation": [1.0, 0.0, 0.0, 0.0]}}, "boxes": [\n' + ",\n".join(gt_lines) + "]}\n")
            preds = []
            for i in range(pred_n):
                if i < len(gts) and rng.random() < 0.8:
                    x, y, name, yaw, v = gts[i]
                    x, y, yaw = x + rng.gauss(0, 0.7), y + rng.gauss(0, 0.7), yaw + rng.gauss(0, 0.3)
                    score = rng.uniform(0.3, 0.95)
                else:
                    a, d = rng.uniform(0, 2 * math.pi), rng.uniform(1, 60)
                    x, y, name, yaw, v = ex + d * math.cos(a), ey + d * math.sin(a), rng.choice(NAMES), 0.0, (0.0, 0.0)
                    score = rng.uniform(0.0, 0.4)
                preds.append(box(x, y, name, yaw, v, f'"sample_token": "{token}", ') + f', "detection_score": {score:.4f}}}')
            r.write(("," if s else "") + f'"{token}": [\n' + ",\n".join(preds) + "]\n")
        g.write("}}\n")
        r.write("}}\n")
    print(f"{out}: {samples} samples, {samples * gt_n} GT boxes, {samples * pred_n} predictions")


if __name__ == "__main__":
    main()
