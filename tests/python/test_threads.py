"""Python threads drive several streams of one model at once (the GIL is released while a frame
runs), and every stream gets exactly what it gets alone."""

import threading
import time

import numpy as np

import bevformer
from conftest import assert_same_detections, micro_model, micro_request


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
    # While frames run on one thread, another thread keeps running Python: with the GIL held
    # through a frame it would make no progress at all during the frames.
    with micro_model() as model:
        reqs = stream_requests(0)
        model(**reqs[0])
        done = threading.Event()
        ticks = []

        def tick():
            while not done.is_set():
                ticks.append(time.perf_counter())
                time.sleep(0)

        t = threading.Thread(target=tick)
        t.start()
        try:
            t0 = time.perf_counter()
            frames = 0
            while time.perf_counter() - t0 < 0.5:
                for r in reqs[1:]:
                    r = dict(r)
                    model(**r)
                    frames += 1
            t1 = time.perf_counter()
        finally:
            done.set()
            t.join()
        inside = [x for x in ticks if t0 <= x <= t1]
        assert frames > 0 and len(inside) > 10 * frames, (frames, len(inside))
