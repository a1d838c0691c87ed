#!/usr/bin/env python3
"""The device-profile flow of BEVFormer ports, on this engine: load the model, run three frames of
one stream to reach the steady state (the history in use), then replay each recorded stage once
between its own signposts and write the profile.

    trace                    (trace2, trace3, ... with --rounds N)
      image ... image_end    model.runner.replay("image")
      bev   ... bev_end      model.runner.replay("bev"), the bev stage with history
      eager ... eager_end    --eager: run_eager("image") and run_eager("bev"), in the first window
    trace_end

The frames are the bundled nuScenes keyframe (data/nuscenes-demo) when the config takes its
1600x900 images, else the config's synthetic request. Writes trace.json (Perfetto), summary.json,
summary.md and memory.json to --out, as `bevformer profile` does.

    PYTHONPATH=build/python python3 examples/profile_ops.py --config tiny --eager --out out/profile_ops
"""

import argparse
import os
import sys
import tempfile

import bevformer
from bevformer import profiling

HERE = os.path.dirname(os.path.abspath(__file__))
DEMO_INFO = os.path.join(HERE, "..", "data", "nuscenes-demo", "info.json")


def frames_of_one_stream(config, seed):
    """Three requests of one stream: the demo frame (its pose advanced 1 m and 0.5 s per frame)
    when the config's images are 1600x900, else frames 0..2 of the synthetic drive."""
    synthetic = bevformer.synthetic_request(config, seed, 0)
    h, w = synthetic["images"][0].shape[:2]
    if (w, h) == (1600, 900) and os.path.exists(DEMO_INFO):
        with tempfile.TemporaryDirectory() as tmp:
            (frame,) = bevformer.convert_info(DEMO_INFO, tmp)
            sample = bevformer.load_sample(frame)
        requests = []
        for k in range(3):
            r = dict(sample)
            stream = dict(r["stream"])
            pose = stream["T_world_from_ego"].copy()
            pose[:3, 3] += k * pose[:3, 0]  # 1 m along the ego's x axis
            stream["T_world_from_ego"] = pose
            r["stream"] = stream
            r["timestamp"] = sample["timestamp"] + 0.5 * k
            r.pop("token", None)
            requests.append(r)
        return "the bundled nuScenes keyframe (data/nuscenes-demo)", requests
    return "the synthetic request", [bevformer.synthetic_request(config, seed, k) for k in range(3)]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="tiny", help="tiny | small | base | a config JSON")
    p.add_argument("--weights", default=None, help="a .pth or .safetensors checkpoint (default: seeded random weights)")
    p.add_argument("--backend", default="cpu")
    p.add_argument("--precision", default="f32", choices=["f32", "bf16"])
    p.add_argument("--threads", type=int, default=0, help="CPU threads (0: one per hardware thread)")
    p.add_argument("--rounds", type=int, default=1, help="profiled windows (trace, trace2, ...)")
    p.add_argument("--eager", action="store_true", help="add one eager run of each stage")
    p.add_argument("--no-peaks", action="store_true", help="skip measuring the machine's matmul and copy peaks")
    p.add_argument("--seed", type=int, default=2026)
    p.add_argument("--out", default="out/profile_ops", help="where the profile files go")
    a = p.parse_args()
    if a.rounds < 1:
        p.error("--rounds must be at least 1")

    with bevformer.BEVFormer.from_pretrained(a.config, a.weights, backend=a.backend, precision=a.precision,
                                             threads=a.threads, profiling=True, seed=a.seed) as model:
        what, requests = frames_of_one_stream(a.config, a.seed)
        print(f"profile_ops: {model!r}")
        print(f"profile_ops: 3 frames of one stream from {what}")
        for k, r in enumerate(requests):
            result = model(**r)
            print(f"  frame {k}: {len(result)} boxes, {'history' if result.used_history else 'first frame'}, "
                  f"{result.seconds['total'] * 1e3:.1f} ms")
        if not result.used_history:
            sys.exit("profile_ops: the third frame did not use the history")
        if a.eager:
            model.runner.prepare_eager()  # its set-up outside the eager range

        prof = profiling.Profiler(model)
        with prof:
            for k in range(a.rounds):
                window = "trace" if k == 0 else f"trace{k + 1}"
                profiling.signpost(window)
                for variant in ("image", "bev"):
                    profiling.signpost(variant)
                    model.runner.replay(variant)
                    profiling.signpost(f"{variant}_end")
                if a.eager and k == 0:
                    profiling.signpost("eager")
                    model.runner.run_eager("image")
                    model.runner.run_eager("bev")
                    profiling.signpost("eager_end")
                profiling.signpost(f"{window}_end")

        summary = prof.report(measure_peaks=not a.no_peaks)
        files = prof.write(a.out)
        print(f"profile_ops: {len(prof.ops)} ops recorded; frame {summary['frame_ms']:.2f} ms "
              f"(image {summary['image_ms']:.2f}, bev {summary['bev_ms']:.2f}; {summary['rounds']} round(s))")
        heaviest = sorted(summary["stages"], key=lambda s: -s["ms"])[:5]
        print("profile_ops: heaviest stages: " + ", ".join(f"{s['name']} {s['ms']:.2f} ms" for s in heaviest))
        for f in files:
            print(f"wrote {f}")


if __name__ == "__main__":
    try:
        main()
    except bevformer.Error as e:
        sys.exit(f"profile_ops: {e}")
