#!/usr/bin/env python3
"""Offline detection of a set of scenes on a Dask cluster: one model per worker (loaded once by a
worker plugin), each scene's frames in timestamp order on one worker (so its history is the one
a single process builds), the results merged into one results_nusc.json in the order the frames
were given. Equal to running the scenes in one process (--in-process), which the tests check.

    PYTHONPATH=build/python python3 examples/dask_detect.py frames/*.json --config tiny \\
        --weights bevformer_tiny_epoch_24.pth --local 2 -o results_nusc.json

--scheduler tcp://HOST:8786 uses a running cluster instead of a local one (its workers need this
package importable, and the frames' image paths readable, where they run).
"""

import argparse
import json
import os
import sys
from collections import OrderedDict

import bevformer


def scenes_of(paths):
    """Frame files grouped by scene (the frame's "scene", else its stream), each scene's frames in
    timestamp order; scenes in the order their first frame was given."""
    scenes = OrderedDict()
    for path in paths:
        with open(path) as f:
            frame = json.load(f)
        key = frame.get("scene") or frame["stream"]
        scenes.setdefault(key, []).append((frame["timestamp"], os.path.abspath(path)))
    return [(key, [p for _, p in sorted(frames)]) for key, frames in scenes.items()]


def run_scene(model, frame_paths):
    """One scene's frames in order on `model`; what results_nusc.json needs of each."""
    out = []
    for path in frame_paths:
        r = model.detect_file(path)
        out.append({"path": path, "stream": r.stream, "timestamp": r.timestamp, "sample_token": r.sample_token,
                    "nuscenes_json": r.nuscenes_json, "boxes": len(r), "used_history": r.used_history})
    if out:
        model.drop_stream(out[-1]["stream"])  # the scene is over: its history would only take a slot
    return out


def load_model(args):
    return bevformer.BEVFormer.from_pretrained(args["config"], args["weights"], threads=args["threads"],
                                               precision=args["precision"])


def detect_on_cluster(client, scenes, model_args):
    from distributed import WorkerPlugin, get_worker

    class ModelPerWorker(WorkerPlugin):
        """Loads the model once when a worker starts (or joins), and closes it with the worker."""

        name = "bevformer-model"

        def __init__(self, args):
            self.args = args

        def setup(self, worker):
            worker.bevformer_model = load_model(self.args)

        def teardown(self, worker):
            worker.bevformer_model.close()

    def scene_task(frame_paths):
        return run_scene(get_worker().bevformer_model, frame_paths)

    client.register_worker_plugin(ModelPerWorker(model_args))
    # One task per scene: a scene's frames never leave the worker that runs its first one.
    futures = [client.submit(scene_task, paths, key=f"scene-{i}-{key}", pure=False) for i, (key, paths) in enumerate(scenes)]
    return client.gather(futures)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("frames", nargs="+", help="frame JSON files (docs/FORMATS.md) with a token and an ego pose")
    p.add_argument("--config", default="tiny")
    p.add_argument("--weights", default=None)
    p.add_argument("--threads", type=int, default=1, help="CPU threads per model (one model per worker)")
    p.add_argument("--precision", default="f32", choices=["f32", "bf16"])
    where = p.add_mutually_exclusive_group()
    where.add_argument("--local", type=int, default=2, metavar="N", help="a local cluster of N worker processes (default 2)")
    where.add_argument("--scheduler", help="the address of a running Dask scheduler")
    where.add_argument("--in-process", action="store_true", help="no cluster: every scene here, one after another")
    p.add_argument("-o", "--output", default="results_nusc.json")
    a = p.parse_args()
    model_args = {"config": a.config, "weights": a.weights, "threads": a.threads, "precision": a.precision}
    scenes = scenes_of(a.frames)
    print(f"dask_detect: {sum(len(s) for _, s in scenes)} frames in {len(scenes)} scene(s)")

    if a.in_process:
        with load_model(model_args) as model:
            per_scene = [run_scene(model, paths) for _, paths in scenes]
    else:
        from distributed import Client, LocalCluster

        if a.scheduler:
            with Client(a.scheduler) as client:
                per_scene = detect_on_cluster(client, scenes, model_args)
        else:
            # Processes, one thread each: a worker runs one scene at a time on its own model.
            with LocalCluster(n_workers=a.local, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
                    Client(cluster) as client:
                per_scene = detect_on_cluster(client, scenes, model_args)

    by_path = {f["path"]: f for scene in per_scene for f in scene}
    ordered = [by_path[os.path.abspath(path)] for path in a.frames]
    text = bevformer.nuscenes_results_json(ordered)
    with open(a.output, "w") as f:
        f.write(text)
    for key, scene in zip((k for k, _ in scenes), per_scene):
        history = sum(f["used_history"] for f in scene)
        print(f"  scene {key}: {len(scene)} frames ({history} with history), {sum(f['boxes'] for f in scene)} boxes")
    print(f"dask_detect: wrote {a.output} ({len(ordered)} samples)")


if __name__ == "__main__":
    try:
        main()
    except bevformer.Error as e:
        sys.exit(f"dask_detect: {e}")
