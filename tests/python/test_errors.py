"""Bad requests and bad calls raise clear Python exceptions that carry the engine's error (kind,
problem, where, expected), never crash, and leave the stream's history as it was."""

import os

import numpy as np
import pytest

import bevformer
from conftest import MICRO, assert_same_detections, micro_model, micro_request


@pytest.fixture(scope="module")
def model():
    with micro_model() as m:
        yield m


def raises(model, kind, where, **request):
    with pytest.raises(bevformer.Error) as info:
        model(**request)
    e = info.value
    assert e.kind == kind, str(e)
    assert where in e.where, (where, str(e))
    assert str(e).startswith(kind.replace("_", " ") if kind != "io" else "i/o")
    return e


def test_frame_fields_are_checked_as_the_frame_json_is(model):
    req = micro_request(0, stream="bad")
    e = raises(model, "invalid_input", "timestamp", **{k: v for k, v in req.items() if k != "timestamp"})
    assert isinstance(e, ValueError) and isinstance(e, bevformer.InvalidInputError)
    raises(model, "invalid_input", "timestamp", **{**req, "timestamp": float("nan")})
    raises(model, "invalid_input", "timestamp", **{**req, "timestamp": "noon"})
    bent = np.array(req["stream"]["T_world_from_ego"], dtype=float)
    bent[0, 0] *= 1.5  # not a rotation
    e = raises(model, "invalid_input", "T_world_from_ego", **{**req, "stream": {"id": "bad", "T_world_from_ego": bent}})
    assert e.expected
    k = np.array(req["intrinsics"], dtype=float)
    k[1][2] = [0.0, 1.0, 5.0]
    raises(model, "invalid_input", "cameras[1].K", **{**req, "intrinsics": k})
    raises(model, "invalid_input", "cameras[0].K", **{**req, "intrinsics": [np.eye(4)] * 6})
    k_nan = np.array(req["intrinsics"], dtype=float)
    k_nan[3][0][0] = np.inf  # frame JSON has no infinity: refused by name, not turned into null
    e = raises(model, "invalid_input", "intrinsics[3][0][0]", **{**req, "intrinsics": k_nan})
    assert "inf" in str(e)
    raises(model, "invalid_input", "stream", **{**req, "stream": {"T_world_from_ego": bent}})
    raises(model, "invalid_input", "stream.speed", **{**req, "stream": {"id": "x", "speed": 3}})
    raises(model, "invalid_input", "colour", **{**req, "colour": "bgr"})
    raises(model, "invalid_input", "intrinsics", **{**req, "intrinsics": req["intrinsics"][:5]})
    raises(model, "invalid_input", "camera_names", **{**req, "camera_names": ["a"]})
    raises(model, "invalid_input", "cameras", **{**req, "images": req["images"][:5], "camera_names": req["camera_names"][:5],
                                                  "intrinsics": req["intrinsics"][:5], "extrinsics": req["extrinsics"][:5]})
    raises(model, "invalid_input", "cameras[0]", **{**req, "camera_names": list(reversed(req["camera_names"]))})
    raises(model, "invalid_input", "T_world_from_ego", **{**req, "T_world_from_ego": np.eye(4)})
    raises(model, "invalid_input", "can_bus[0]", **{**req, "can_bus": [object()] * 18})
    raises(model, "invalid_input", "can_bus", **{**req, "can_bus": [1.0] * 17})


def test_images_are_checked(model):
    req = micro_request(0, stream="bad")
    good = [bevformer.read_image(p) for p in req["images"]]
    e = raises(model, "invalid_input", "images[2]", **{**req, "images": good[:2] + [good[2].astype(np.float32)] + good[3:]})
    assert "uint8" in e.expected
    raises(model, "invalid_input", "images[0]", **{**req, "images": [good[0][..., 0]] + good[1:]})
    raises(model, "invalid_input", "images[0]", **{**req, "images": [np.dstack([good[0], good[0][..., :1]])] + good[1:]})
    e = raises(model, "invalid_input", "cameras[3]", **{**req, "images": good[:3] + [good[3][:60]] + good[4:]})
    assert "112x63" in str(e)
    raises(model, "invalid_input", "images[1]", **{**req, "images": [good[0], 42] + good[2:]})
    raises(model, "invalid_input", "cameras[4]", **{**req, "images": good[:4] + [b"\x89PNG\r\n\x1a\n broken"] + good[5:]})
    raises(model, "invalid_input", "cameras[0]", **{**req, "images": [b""] + good[1:]})
    e = raises(model, "not_found", "no-such.png", **{**req, "images": ["/nonexistent/no-such.png"] + good[1:]})
    assert isinstance(e, FileNotFoundError)
    raises(model, "invalid_input", "color_order", **{**req, "images": good, "color_order": "grb"})


def test_a_failed_frame_leaves_the_stream_as_it_was():
    with micro_model() as tested, micro_model() as clean:
        tested(**micro_request(0))
        clean(**micro_request(0))
        bad = micro_request(1)
        bad["images"] = bad["images"][:5] + [np.zeros((63, 112), np.uint8)]
        with pytest.raises(bevformer.InvalidInputError):
            tested(**bad)
        for k in (1, 2):
            assert_same_detections(tested(**micro_request(k)), clean(**micro_request(k)))


def test_bad_calls(model, tmp_path):
    with pytest.raises(bevformer.NotFoundError) as info:
        bevformer.BEVFormer.from_pretrained("tiny", tmp_path / "missing.pth")
    assert "missing.pth" in str(info.value)
    with pytest.raises(bevformer.InvalidInputError) as info:
        bevformer.BEVFormer.from_pretrained(os.path.join(MICRO, "config.json"), precision="f16")
    assert "precision" in str(info.value) or "f16" in str(info.value)
    with pytest.raises(bevformer.Error):
        bevformer.BEVFormer.from_pretrained(os.path.join(MICRO, "config.json"), backend="tpu")
    with pytest.raises(bevformer.InvalidInputError):
        bevformer.BEVFormer(os.path.join(MICRO, "config.json"), threads="many")
    with pytest.raises(TypeError):
        bevformer.BEVFormer(os.path.join(MICRO, "config.json"), warp_speed=9)
    with pytest.raises(bevformer.InvalidInputError):
        model.runner.replay("decoder")
    with pytest.raises(bevformer.UnsupportedError) as info:
        bevformer.profiling.Profiler(model)
    assert "profiling=True" in info.value.hint
    with pytest.raises(bevformer.NotFoundError):
        bevformer.load_sample(tmp_path / "none.json")
    (tmp_path / "bad.json").write_text('{"stream": "s", "timestamp": 1, "cameras": [], "stream": "t"}')
    with pytest.raises(bevformer.InvalidInputError):
        bevformer.load_sample(tmp_path / "bad.json")
    with pytest.raises(bevformer.InvalidInputError):
        bevformer.read_image(b"not an image")
    closed = micro_model()
    closed.close()
    closed.close()  # twice is fine
    with pytest.raises(bevformer.InvalidInputError) as info:
        closed(**micro_request(0))
    assert "closed" in str(info.value)
    with pytest.raises(bevformer.InvalidInputError):
        closed.runner.describe()


def test_a_fresh_model_has_nothing_to_replay():
    with micro_model() as m:
        with pytest.raises(bevformer.NotFoundError) as info:
            m.runner.replay("image")
        assert info.value.hint
        with pytest.raises(bevformer.NotFoundError):
            m.runner.run_eager("image")
        m(**micro_request(0))
        with pytest.raises(bevformer.NotFoundError) as info:
            m.runner.replay("bev")
        assert "second frame" in info.value.hint
        m.runner.replay("bev_first")


def test_a_precision_this_cpu_lacks_is_refused_naming_what_it_lacks():
    # In a child process capped to AVX2 (ONEDNN_MAX_CPU_ISA caps oneDNN and every kernel, and is
    # read once per process): bf16 needs AVX-512 there, as on a Zen 3. Refused at load, with the
    # unsupported kind, what the CPU lacks and only what runs instead; f32 loads.
    import subprocess
    import sys
    code = f"""
import bevformer
cfg = {os.path.join(MICRO, "config.json")!r}
try:
    bevformer.BEVFormer.from_pretrained(cfg, precision="bf16")
    print("loaded")
except bevformer.UnsupportedError as e:
    assert isinstance(e, NotImplementedError), type(e).__mro__
    print("refused:", e)
bevformer.BEVFormer.from_pretrained(cfg, precision="f32").close()
print("f32 ok")
"""
    env = dict(os.environ, ONEDNN_MAX_CPU_ISA="AVX2")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "refused: " in r.stdout, r.stdout
    message = r.stdout.split("refused: ", 1)[1]
    assert "bf16" in message and "lacks AVX-512" in message, message
    assert "--precision f32 runs here" in message, message
    assert "f32 ok" in r.stdout, r.stdout
