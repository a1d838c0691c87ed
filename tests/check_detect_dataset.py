#!/usr/bin/env python3
"""ctest cli_detect_dataset: `detect` over a small "dataset" as a dataset-scale run does it.
Standard library only.

    check_detect_dataset.py BEVFORMER MICRO_DIR TMP

Six frames of the micro golden set on three scenes (two streams, one of them with a scene change),
each with a sample token and an ego pose. Checked:
  - two shards (--shard 1/2, 2/2) hold every sample once, scenes whole, and merged they equal one
    whole run, box for box;
  - a run cut short (the results file truncated inside its third sample, as a crash leaves it)
    and then --resume'd gives the whole run's file again, writing only what was missing, and the
    re-run scene starts from its first frame (its history);
  - progress lines carry an ETA; a missing frame file or an unwritable output fails before the
    model loads (exit 2)."""

import json
import os
import subprocess
import sys

binary, micro, tmp = sys.argv[1], sys.argv[2], sys.argv[3]
os.makedirs(tmp, exist_ok=True)
config = os.path.join(micro, "config.json")
weights = os.path.join(micro, "checkpoint.pth")


def frame(k, stream, scene, t_offset):
    meta = json.load(open(os.path.join(micro, f"frame{k}_meta.json")))
    f = {"stream": stream, "timestamp": meta["timestamp"] + t_offset, "scene": scene,
         "token": f"{scene}-{k}", "T_world_from_ego": meta["ego2global"],
         "T_ego_from_lidar": meta["lidar2ego"], "can_bus": meta["can_bus"], "cameras": []}
    for c in meta["cameras"]:
        f["cameras"].append({"name": c["name"], "image": os.path.join(micro, meta["img_filenames"][c["index"]]),
                             "K": c["cam2img"], "T_ego_from_cam": c["cam2ego"]})
    return f


paths = []
plan = [(0, "car-a", "scene-1", 0), (1, "car-a", "scene-1", 0), (2, "car-a", "scene-1", 0),
        (0, "car-b", "scene-2", 0), (1, "car-b", "scene-2", 0),
        (0, "car-a", "scene-3", 100)]  # car-a again, later, in a new scene
for i, (k, stream, scene, dt) in enumerate(plan):
    p = os.path.join(tmp, f"f{i}.json")
    json.dump(frame(k, stream, scene, dt), open(p, "w"))
    paths.append(p)


def detect(*args, expect=0):
    r = subprocess.run([binary, "detect", "--config", config, "--weights", weights, "--threads", "2", "--top", "0",
                        *args], capture_output=True, text=True)
    assert r.returncode == expect, f"exit {r.returncode}, expected {expect}: {r.stderr[-2000:]}"
    return r


def results(path):
    return json.load(open(path))["results"]


whole = os.path.join(tmp, "whole.json")
r = detect(*paths, "--nusc", whole)
assert "ETA" in r.stderr, r.stderr
want = results(whole)
assert list(want) == [f"scene-1-{k}" for k in range(3)] + ["scene-2-0", "scene-2-1", "scene-3-0"], list(want)

# Shards: scenes whole, every sample once, merged equal to the whole run.
shards = []
for k in (1, 2):
    s = os.path.join(tmp, f"shard{k}.json")
    detect(*paths, "--nusc", s, "--shard", f"{k}/2")
    shards.append(results(s))
assert not set(shards[0]) & set(shards[1]), "a sample in two shards"
for part in shards:
    scenes = {t.rsplit("-", 1)[0] for t in part}
    for t in want:
        if t.rsplit("-", 1)[0] in scenes:
            assert t in part, f"scene of {t} split across shards"
merged = os.path.join(tmp, "merged.json")
m = subprocess.run([binary, "merge-results", os.path.join(tmp, "shard1.json"), os.path.join(tmp, "shard2.json"),
                    "-o", merged], capture_output=True, text=True)
assert m.returncode == 0, m.stderr
got = results(merged)
assert set(got) == set(want), (set(got), set(want))
for t in want:
    assert got[t] == want[t], f"{t}: shard result differs from the whole run"

# A crash inside the third sample: its line is cut; --resume reruns scene-1 from its first frame
# (frames 0 and 1 again, for history) but writes only what is missing.
cut = os.path.join(tmp, "cut.json")
text = open(whole).read()
third = text.index('"scene-1-2"')
open(cut, "w").write(text[:third + 40])
r = detect(*paths, "--nusc", cut, "--resume")
assert "already in" in r.stderr and "6 of 6 frames left" in r.stderr, r.stderr
assert "4 written by this run" in r.stdout, r.stdout
resumed = results(cut)
assert list(resumed) == list(want), list(resumed)
for t in want:
    assert resumed[t] == want[t], f"{t}: resumed result differs from the whole run"
# Everything written: a second --resume runs nothing.
r = detect(*paths, "--nusc", cut, "--resume")
assert "0 of 6 frames left" in r.stderr, r.stderr

# Checked before the model loads: a missing frame file, an output folder that does not exist.
r = detect(os.path.join(tmp, "missing.json"), expect=2)
assert "no such frame file" in r.stderr and "loading" not in r.stderr, r.stderr
r = detect(paths[0], "-o", os.path.join(tmp, "no-such-dir", "out.json"), expect=2)
assert "not writable" in r.stderr and "loading" not in r.stderr, r.stderr
print("detect dataset run: shards, resume and preflight checks OK")
