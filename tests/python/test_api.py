"""The API on the golden micro set: the detections of `bevformer golden`, bit for bit, whether
the images come as paths, bytes, HxWx3 arrays (BGR or RGB) or a frame JSON file; a PNG of the
same pixels detects the same; the model object's surfaces."""

import json
import os

import numpy as np
import pytest

import bevformer
from conftest import MICRO, SOURCE, assert_same_detections, micro_model, micro_request, png_bytes, png_pixels


def test_paths_give_the_golden_detections(golden_dump):
    with micro_model() as model:
        for k in range(3):
            r = model(**micro_request(k))
            assert r.used_history == (k > 0)
            assert r.frame_index == k
            assert not r.untrained
            assert len(r) > 250
            assert r.boxes.shape == (len(r), 9) and r.boxes.dtype == np.float32
            assert r.labels.dtype == np.int64
            assert r.class_names == [model.class_names[i] for i in r.labels]
            assert_same_detections(r, golden_dump[k])
            doc = r.detections()
            assert len(doc["detections"]) == len(r) and "world" in doc["detections"][0]
            assert set(r.seconds) == {"total", "prepare", "geometry", "image", "bev", "output"}
        (s,) = model.streams()
        assert s["id"] == "micro" and s["frames"] == 3 and s["has_history"]


def test_arrays_bytes_and_rgb_give_the_same_bits(golden_dump):
    with micro_model() as model:
        for k in range(3):
            req = micro_request(k)
            paths = req["images"]
            kind = ("array", "bytes", "rgb")[k]
            if kind == "array":
                req["images"] = [bevformer.read_image(p) for p in paths]
            elif kind == "bytes":
                req["images"] = [open(p, "rb").read() for p in paths]
            else:
                req["images"] = [bevformer.read_image(p)[..., ::-1].copy() for p in paths]
                req["color_order"] = "rgb"
            assert_same_detections(model(**req), golden_dump[k])


def test_the_engines_decoder_matches_an_independent_one():
    path = micro_request(0)["images"][0]
    ours = bevformer.read_image(path)
    with open(path, "rb") as f:
        theirs = png_pixels(f.read())
    assert ours.dtype == np.uint8 and ours.shape == theirs.shape
    np.testing.assert_array_equal(ours, theirs)


def test_a_png_of_the_pixels_detects_the_same_bit_for_bit():
    # Pixels that no file held: the golden images with a seeded perturbation (never zeros).
    rng = np.random.default_rng(7)
    req = micro_request(0)
    pixels = []
    for p in req["images"]:
        img = bevformer.read_image(p).astype(np.int16) + rng.integers(-40, 41, size=(63, 112, 3))
        pixels.append(np.clip(img, 0, 255).astype(np.uint8))
    assert all(px.std() > 10 for px in pixels)
    with micro_model() as a, micro_model() as b:
        from_arrays = a(**{**req, "images": pixels})
        from_png = b(**{**req, "images": [png_bytes(px) for px in pixels]})
    assert_same_detections(from_arrays, from_png)


def test_non_contiguous_arrays_are_read_as_numpy_sees_them(golden_dump):
    req = micro_request(0)
    padded = []
    for p in req["images"]:
        img = bevformer.read_image(p)
        big = np.zeros((70, 120, 3), np.uint8)
        big[3:66, 5:117] = img
        padded.append(big[3:66, 5:117])  # a view with row strides of the big image
    assert not padded[0].flags["C_CONTIGUOUS"]
    with micro_model() as model:
        assert_same_detections(model(**{**req, "images": padded}), golden_dump[0])


def test_load_sample_and_frame_json(tmp_path, golden_dump):
    frames = []
    for k in range(3):
        path = tmp_path / f"frame{k}.json"
        path.write_text(bevformer.frame_json({**micro_request(k), "images": [bevformer.read_image(p) for p in micro_request(k)["images"]]}))
        frames.append(path)
    with micro_model() as model:
        for k, path in enumerate(frames):
            sample = bevformer.load_sample(path)
            assert isinstance(sample["images"][0], bytes)  # inline PNG
            assert sample["stream"]["id"] == "micro" and sample["stream"]["T_world_from_ego"].shape == (4, 4)
            assert sample["intrinsics"].shape == (6, 3, 3)
            assert_same_detections(model(**sample), golden_dump[k])
    with micro_model() as model:
        for k, path in enumerate(frames):
            assert_same_detections(model.detect_file(path), golden_dump[k])


def test_load_sample_of_the_bundled_nuscenes_frame(tmp_path):
    (frame,) = bevformer.convert_info(os.path.join(SOURCE, "data", "nuscenes-demo", "info.json"), tmp_path)
    sample = bevformer.load_sample(frame)
    assert len(sample["images"]) == 6 and all(os.path.isabs(p) and os.path.exists(p) for p in sample["images"])
    assert sample["camera_names"][0] == "CAM_FRONT" and "lidar2img" in sample
    decoded = bevformer.load_sample(frame, decode=True)
    assert decoded["images"][0].shape == (900, 1600, 3) and decoded["images"][0].std() > 10


def test_synthetic_request_runs_and_warms_up():
    req = bevformer.synthetic_request(os.path.join(MICRO, "config.json"), seed=3, index=0)
    assert req["images"][0].shape == (63, 112, 3) and req["images"][0].std() > 10
    again = bevformer.synthetic_request(os.path.join(MICRO, "config.json"), seed=3, index=0)
    np.testing.assert_array_equal(req["images"][2], again["images"][2])
    with micro_model() as model:
        results = model.warmup(frames=2)
        assert [r.used_history for r in results] == [False, True]
        assert model.streams() == []
        assert [s["name"] for s in model.runner.stages()][:1] == ["image"]
        r = model(**req)
        assert len(r) > 0 and not r.used_history


def test_model_surfaces():
    with micro_model(precision="f32", max_streams=8) as model:
        info = model.device_info
        assert info["backend"] == "cpu" and info["threads"] == 1 and info["precision"] == "f32"
        assert info["float_precision"] == "f32"
        assert info["device"] and info["isa"]
        assert set(info["versions"]) >= {"bevformer", "onednn", "opencv", "pybind11"}
        knobs = model.knobs.as_dict()
        assert knobs["max_streams"] == 8 and knobs["threads"] == 1 and knobs["profiling"] is False
        assert model.knobs.backend == "cpu"
        assert model.class_names[0] == "car" and len(model.class_names) == 10
        assert "BEV 20x20" in model.config_summary()
        assert "bev (with history)" in model.describe()
        model(**micro_request(0, stream="a"))
        model(**micro_request(0, stream="b"))
        assert sorted(s["id"] for s in model.streams()) == ["a", "b"]
        assert model.drop_stream("a") is True and model.drop_stream("a") is False
        assert model.stream_totals()["dropped"] == 1
    assert model.closed
    assert "closed" in repr(model)
    assert set(bevformer.versions()) >= {"numpy", "python", "onednn"}
    assert "cpu" in bevformer.available_backends()


def test_results_nusc_of_a_stream():
    with micro_model() as model:
        results = []
        for k in range(3):
            req = micro_request(k)
            req["token"] = f"sample-{k}"
            results.append(model(**req))
    doc = json.loads(bevformer.nuscenes_results_json(results))
    assert list(doc["results"]) == ["sample-0", "sample-1", "sample-2"]
    assert doc["meta"]["use_camera"] is True
    assert len(doc["results"]["sample-1"]) == len(json.loads(results[1].nuscenes_json))


def test_untrained_model_says_so():
    with bevformer.BEVFormer.from_pretrained(os.path.join(MICRO, "config.json"), threads=1) as model:
        r = model(**micro_request(0))
        assert model.untrained and r.untrained and "UNTRAINED" in repr(r)
        assert r.detections()["untrained"] is True


def test_detect_batch_answers_each_frame_as_a_call_alone_does():
    # Three vehicles' frames interleaved: each stream's in order, run together in batches of
    # three, every frame as model(**request) answers it alone; a frame whose bev stage overflows
    # and a request that is not a frame fail alone, and their streams go on from the history
    # they had.
    requests = []
    for k in range(3):
        for stream in ("a", "b", "c"):
            req = micro_request(k, stream=stream)
            pose = np.array(req["stream"]["T_world_from_ego"], dtype=float)
            if stream == "b":
                pose[0, 3] += 2.5
                req["images"] = [bevformer.read_image(p) for p in req["images"]]  # arrays batch too
            req["stream"]["T_world_from_ego"] = pose
            if stream == "c" and k == 1:
                req["can_bus"] = list(req["can_bus"])
                req["can_bus"][13] = 3e38  # finite, but the CAN-bus MLP overflows in the bev stage
            requests.append(req)
    requests.insert(4, {**micro_request(0, stream="d"), "timestamp": "noon"})
    with micro_model(max_batch=3) as batched, micro_model() as single:
        assert batched.knobs.max_batch == 3
        out = batched.detect_batch(requests, return_exceptions=True)
        assert len(out) == len(requests)
        for i, (req, got) in enumerate(zip(requests, out)):
            try:
                want = single(**req)
            except bevformer.Error as e:
                assert isinstance(got, type(e)), (i, got)
                assert got.where == e.where and got.problem == e.problem
                continue
            assert isinstance(got, bevformer.Result), (i, got)
            assert got.json == want.json, i
            assert_same_detections(got, want)
            assert got.frame_index == want.frame_index and got.batch_size == 3 and want.batch_size == 1
        assert isinstance(out[4], bevformer.InvalidInputError) and "timestamp" in out[4].where
        assert "bev stage produced" in str(out[6])
        with pytest.raises(bevformer.InvalidInputError) as info:
            batched.detect_batch([{**micro_request(0, stream="e"), "timestamp": "noon"}, micro_request(0, stream="f")])
        assert isinstance(info.value.outcomes[1], bevformer.Result)  # the others ran all the same
