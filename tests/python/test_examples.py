"""The example scripts as a user runs them: examples/profile_ops.py writes a profile of the
device-profile flow, and examples/dask_detect.py on a local cluster of two workers gives the
results_nusc.json of running the same scenes in one process."""

import json
import os
import subprocess
import sys

import numpy as np

import bevformer
from conftest import MICRO, SOURCE, micro_request

CONFIG = os.path.join(MICRO, "config.json")
WEIGHTS = os.path.join(MICRO, "checkpoint.pth")


def run(*args):
    p = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


def test_profile_ops(tmp_path):
    out = run(os.path.join(SOURCE, "examples", "profile_ops.py"), "--config", CONFIG, "--weights", WEIGHTS,
              "--threads", "1", "--rounds", "2", "--eager", "--no-peaks", "--out", str(tmp_path))
    assert "from the synthetic request" in out and "frame 2:" in out and "history" in out
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["rounds"] == 2 and summary["eager_frame_ms"] > 0
    assert summary["labels_from_eager"] is True, summary["labels_note"]
    names = [e["name"] for e in json.loads((tmp_path / "trace.json").read_text())["traceEvents"] if e.get("ph") == "B"]
    assert names[:2] == ["trace", "image"] and "trace2" in names and "eager" in names
    for f in ("trace.json", "summary.md", "memory.json"):
        assert (tmp_path / f).stat().st_size > 0


def write_scenes(tmp_path):
    """Three scenes of micro frames, each with its own stream, scene, tokens and pose offset (so
    their results differ), listed interleaved: the merge must restore the given order."""
    scenes = {"A": ([0, 1, 2], 0.0), "B": ([0, 1, 2], 2.0), "C": ([1, 2], -1.5)}
    files = {}
    for name, (frames, dx) in scenes.items():
        for k in frames:
            req = micro_request(k, stream=f"vehicle-{name}")
            pose = np.array(req["stream"]["T_world_from_ego"], dtype=float)
            pose[0, 3] += dx
            req["stream"]["T_world_from_ego"] = pose
            req["scene"] = f"scene-{name}"
            req["token"] = f"{name}{k}"
            path = tmp_path / f"{name}{k}.json"
            path.write_text(bevformer.frame_json(req))
            files[(name, k)] = str(path)
    order = [("A", 0), ("B", 0), ("C", 1), ("A", 1), ("B", 1), ("C", 2), ("A", 2), ("B", 2)]
    return [files[x] for x in order]


def test_dask_detect_on_two_workers_equals_one_process(tmp_path):
    frames = write_scenes(tmp_path)
    script = os.path.join(SOURCE, "examples", "dask_detect.py")
    common = ["--config", CONFIG, "--weights", WEIGHTS, "--threads", "1"]
    out = run(script, *frames, *common, "--local", "2", "-o", str(tmp_path / "cluster.json"))
    assert "8 frames in 3 scene(s)" in out
    run(script, *frames, *common, "--in-process", "-o", str(tmp_path / "alone.json"))
    cluster = (tmp_path / "cluster.json").read_text()
    assert cluster == (tmp_path / "alone.json").read_text()
    doc = json.loads(cluster)
    assert list(doc["results"]) == ["A0", "B0", "C1", "A1", "B1", "C2", "A2", "B2"]
    assert doc["results"]["A1"] != doc["results"]["B1"]  # the scenes computed different things
    assert all(len(v) > 0 for v in doc["results"].values())
