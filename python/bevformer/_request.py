"""Requests: frame JSON files as request kwargs, a synthetic request, images decoded as the engine
decodes them, and a request written back as frame JSON."""

import os

from . import _bevformer


def load_sample(path, decode=False):
    """A frame JSON file (docs/FORMATS.md) as the kwargs of model(**request): images by absolute
    path (or bytes when inline), or decoded to HxWx3 uint8 BGR arrays when `decode`; calibration as
    intrinsics + extrinsics or lidar2img arrays; the pose under stream["T_world_from_ego"]."""
    return _bevformer.load_sample(os.fspath(path), decode)


def synthetic_request(config="tiny", seed=2026, index=0):
    """Frame `index` of a seeded synthetic drive for `config`: images of the config's size, the
    synthetic six-camera rig, the ego 1 m forward and 2 degrees left per frame. For warm-ups and
    tests; nothing it gives is a detection."""
    return _bevformer.synthetic_request(os.fspath(config), seed, index)


def read_image(source):
    """A JPEG or PNG (a path or its bytes) decoded as the engine decodes it: HxWx3 uint8 BGR."""
    return _bevformer.read_image(source)


def frame_json(request):
    """The request as frame JSON text (docs/FORMATS.md): arrays and bytes inline as base64 (arrays
    as PNG, lossless), paths as paths."""
    return _bevformer.frame_json(dict(request))


def convert_info(info, out_dir, stream="", scene=""):
    """An mmdetection3d info file (v1.1) as frame JSON files in out_dir, one per entry in
    timestamp order (`bevformer convert-info`); returns their paths."""
    return _bevformer.convert_info(os.fspath(info), os.fspath(out_dir), stream, scene)


def nuscenes_results_json(results):
    """results_nusc.json text (the nuScenes detection submission) of Results, or of dicts with
    stream, timestamp, sample_token and nuscenes_json, in the order given (frames need a sample
    token and an ego pose)."""
    return _bevformer.nuscenes_results_json(list(results))
