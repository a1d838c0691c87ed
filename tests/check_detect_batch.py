#!/usr/bin/env python3
"""ctest cli_detect_batch: `detect --batch N` gives what `detect` gives one frame at a time.
Standard library only.

    check_detect_batch.py BEVFORMER MICRO_DIR TMP

Eight frames of the micro golden set on three streams (vehicles): one on the golden rig, one on
another rig (longer focal lengths, so other SCA lists) that starts later, one whose scene changes
inside the run; their image paths relative to the frame files' folders, which differ. Checked:
  - --batch 4, 3 and 2 write the same detections document (frames in the order given) and
    the same results_nusc.json as --batch 1, byte for byte / sample for sample;
  - the batched run says how many batches it ran; --batch with --render, and --batch 0, are
    refused before the model loads (exit 2)."""

import json
import os
import subprocess
import sys

binary, micro, tmp = sys.argv[1], sys.argv[2], sys.argv[3]
os.makedirs(tmp, exist_ok=True)
config = os.path.join(micro, "config.json")
weights = os.path.join(micro, "checkpoint.pth")


def frame(k, stream, scene, focal_scale, folder):
    meta = json.load(open(os.path.join(micro, f"frame{k}_meta.json")))
    f = {"stream": stream, "timestamp": meta["timestamp"], "scene": scene, "token": f"{stream}-{scene}-{k}",
         "T_world_from_ego": meta["ego2global"], "T_ego_from_lidar": meta["lidar2ego"],
         "can_bus": meta["can_bus"], "cameras": []}
    for c in meta["cameras"]:
        K = [[v * focal_scale if (r < 2 and col < 2) else v for col, v in enumerate(row)]
             for r, row in enumerate(c["cam2img"])]
        image = os.path.relpath(os.path.join(micro, meta["img_filenames"][c["index"]]), folder)
        f["cameras"].append({"name": c["name"], "image": image, "K": K, "T_ego_from_cam": c["cam2ego"]})
    return f


plan = [(0, "golden", "scene-1", 1.0), (0, "scene-change", "scene-2", 1.0), (1, "golden", "scene-1", 1.0),
        (0, "other-rig", "scene-3", 1.2), (1, "scene-change", "scene-2", 1.0), (2, "golden", "scene-1", 1.0),
        (1, "other-rig", "scene-3", 1.2), (2, "scene-change", "scene-4", 1.0)]
paths = []
for i, (k, stream, scene, scale) in enumerate(plan):
    folder = os.path.join(tmp, f"frames-{stream}")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{i}.json")
    with open(path, "w") as out:
        json.dump(frame(k, stream, scene, scale, folder), out)
    paths.append(path)


def detect(batch, *extra):
    out, nusc = os.path.join(tmp, f"det-{batch}.json"), os.path.join(tmp, f"nusc-{batch}.json")
    for p in (out, nusc):
        if os.path.exists(p):
            os.remove(p)
    r = subprocess.run([binary, "detect", "--config", config, "--weights", weights, "--threads", "2", "--batch",
                        str(batch), "-o", out, "--nusc", nusc, *extra, *paths], capture_output=True, text=True)
    return r, out, nusc


failures = []
r1, out1, nusc1 = detect(1)
if r1.returncode != 0:
    sys.exit(f"detect --batch 1 failed ({r1.returncode}):\n{r1.stderr}")
doc1 = open(out1, "rb").read()
res1 = json.load(open(nusc1))["results"]
if len(res1) != len(plan):
    failures.append(f"--batch 1 wrote {len(res1)} samples, want {len(plan)}")
for batch in (4, 3, 2):
    r, out, nusc = detect(batch)
    if r.returncode != 0:
        failures.append(f"detect --batch {batch} failed ({r.returncode}):\n{r.stderr}")
        continue
    if open(out, "rb").read() != doc1:
        failures.append(f"--batch {batch}: the detections document differs from --batch 1")
    if json.load(open(nusc))["results"] != res1:
        failures.append(f"--batch {batch}: results_nusc.json differs from --batch 1")
    if " batches (" not in r.stderr:
        failures.append(f"--batch {batch}: no batch summary on stderr:\n{r.stderr[-2000:]}")

# Refused before the model loads.
r = subprocess.run([binary, "detect", "--config", config, "--batch", "2", "--render", os.path.join(tmp, "x.png"),
                    paths[0]], capture_output=True, text=True)
if r.returncode != 2 or "--render" not in r.stderr or "loading" in r.stderr:
    failures.append(f"--batch 2 --render: exit {r.returncode}, want 2 before loading:\n{r.stderr}")
r = subprocess.run([binary, "detect", "--config", config, "--batch", "0", paths[0]], capture_output=True, text=True)
if r.returncode == 0:
    failures.append("--batch 0 was accepted")

if failures:
    print("\n".join(failures))
    sys.exit(1)
print(f"detect --batch: {len(plan)} frames on 3 streams, --batch 2, 3 and 4 byte-identical to --batch 1")
