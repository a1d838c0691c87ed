"""Python threads drive several streams of one model at once (the GIL is released while a frame
runs), and every stream gets exactly what it gets alone."""

import os
import subprocess
import sys
import threading
import time

import numpy as np

import bevformer
from conftest import MICRO, assert_same_detections, micro_model, micro_request


def stream_requests(s):
    """Stream s: the micro frames, each stream with its own pixels (a seeded shift of the golden
    images) and its own pose, so that no two streams compute the same thing."""
    rng = np.random.default_rng(100 + s)
    out = []
    for k in range(3):
        req = micro_request(k, stream=f"car-{s}")
        req["images"] = [np.roll(bevformer.read_image(p), shift=int(rng.integers(1, 20)), axis=1) for p in req["images"]]
        pose = np.array(req["stream"]["T_world_from_ego"], dtype=float)
        pose[0, 3] += 3.0 * s
        req["stream"]["T_world_from_ego"] = pose
        out.append(req)
    return out


def test_threads_driving_streams_equal_each_stream_alone():
    streams = [stream_requests(s) for s in range(4)]
    alone = []
    for reqs in streams:
        with micro_model() as m:
            alone.append([m(**r) for r in reqs])

    with micro_model() as model:
        together = [[None] * 3 for _ in streams]
        errors = []
        start = threading.Barrier(len(streams))

        def drive(s):
            try:
                start.wait()
                for k, r in enumerate(streams[s]):
                    together[s][k] = model(**r)
            except Exception as e:  # reported below, with the stream
                errors.append((s, e))

        threads = [threading.Thread(target=drive, args=(s,)) for s in range(len(streams))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        for s in range(len(streams)):
            for k in range(3):
                assert_same_detections(together[s][k], alone[s][k])
        assert sorted(x["id"] for x in model.streams()) == [f"car-{s}" for s in range(len(streams))]


def test_the_gil_is_released_while_a_frame_runs():
    # With a switch interval far longer than the test, a thread gives up the GIL only where it
    # releases it itself. So the main thread can run between the frame thread's "calling" and
    # "returned" only if the frame released the GIL; were it held, main would next run after the
    # call returned and see both. No clock is read: only the order of events.
    with micro_model() as model:
        reqs = stream_requests(0)
        model(**reqs[0])
        state = []

        def frame():
            state.append("calling")
            state.append(model(**reqs[1]))

        before = sys.getswitchinterval()
        sys.setswitchinterval(1000.0)
        try:
            t = threading.Thread(target=frame)
            t.start()
            while not state:
                time.sleep(0.001)  # waits with the GIL released, so the frame thread can start
            seen = list(state)
            t.join()
        finally:
            sys.setswitchinterval(before)
        assert seen == ["calling"], "the frame held the GIL"
        assert state[1].used_history  # and the frame itself ran as usual


def test_threads_making_their_first_arrays_at_once_in_a_fresh_interpreter():
    # The first arrays of a process, made by several threads at once (as the threads example in
    # docs/PYTHON.md does), once deadlocked inside pybind11's lookup of numpy's C API.
    code = """
import sys, threading
import bevformer
config = sys.argv[1]
start = threading.Barrier(4)
out = []
def first_arrays(seed):
    start.wait()
    out.append(bevformer.synthetic_request(config, seed, 0)["images"][0].shape)
threads = [threading.Thread(target=first_arrays, args=(s,)) for s in range(4)]
for t in threads: t.start()
for t in threads: t.join()
print(len(out))
"""
    try:
        p = subprocess.run([sys.executable, "-c", code, os.path.join(MICRO, "config.json")], capture_output=True,
                           text=True, timeout=120)
    except subprocess.TimeoutExpired:
        raise AssertionError("four threads making their first arrays deadlocked") from None
    assert p.returncode == 0 and p.stdout.strip() == "4", p.stdout + p.stderr
