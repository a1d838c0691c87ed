"""Shared fixtures of the Python package's tests: the golden micro set as requests, its model,
`bevformer golden --dump` of it, and a PNG writer that owes nothing to the engine.

ctest runs these with PYTHONPATH=<build>/python, BEV_SHARED_DIR, BEV_CLI (the bevformer binary)
and BEV_SOURCE_DIR set (tests/CMakeLists.txt)."""

import json
import os
import struct
import subprocess
import zlib

import numpy as np
import pytest

import bevformer

SHARED = os.environ.get("BEV_SHARED_DIR", os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared"))
MICRO = os.path.join(SHARED, "golden", "micro")
SOURCE = os.environ.get("BEV_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
CLI = os.environ.get("BEV_CLI", os.path.join(SOURCE, "build", "bin", "bevformer"))


def micro_request(k, stream="micro"):
    """Golden frame k of the micro set as request kwargs: PNG paths, K + extrinsics, the ego pose,
    the raw CAN fields (as tests/micro_frames.h builds its frame JSON)."""
    with open(os.path.join(MICRO, f"frame{k}_meta.json")) as f:
        meta = json.load(f)
    cams = meta["cameras"]
    return dict(
        stream={"id": stream, "T_world_from_ego": meta["ego2global"]},
        timestamp=meta["timestamp"],
        scene=meta["scene_token"],
        T_ego_from_lidar=meta["lidar2ego"],
        can_bus=meta["can_bus"],
        images=[os.path.join(MICRO, meta["img_filenames"][c["index"]]) for c in cams],
        camera_names=[c["name"] for c in cams],
        intrinsics=[c["cam2img"] for c in cams],
        extrinsics=[c["cam2ego"] for c in cams],
    )


def micro_model(**knobs):
    knobs.setdefault("threads", 1)  # one: CI runs tests side by side, and OpenMP teams crawl when oversubscribed
    return bevformer.BEVFormer.from_pretrained(os.path.join(MICRO, "config.json"),
                                               os.path.join(MICRO, "checkpoint.pth"), **knobs)


def read_safetensors(path):
    """name -> numpy array (the format: u64 header length, JSON header, raw little-endian data)."""
    dtypes = {"F32": np.float32, "F64": np.float64, "I64": np.int64, "I32": np.int32, "U8": np.uint8}
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        b, e = t["data_offsets"]
        out[name] = np.frombuffer(data[8 + n + b:8 + n + e], dtype=dtypes[t["dtype"]]).reshape(t["shape"])
    return out


def png_bytes(bgr):
    """An HxWx3 uint8 BGR array as an RGB PNG, written here with zlib (filter 0 rows), so that a
    test of the engine's pixel path does not lean on the engine's own encoder."""
    h, w, _ = bgr.shape
    rgb = np.ascontiguousarray(bgr[..., ::-1])
    raw = b"".join(b"\x00" + rgb[y].tobytes() for y in range(h))

    def chunk(kind, payload):
        return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)) +
            chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b""))


def png_pixels(data):
    """The pixels of an 8-bit RGB or RGBA, non-interlaced PNG as HxWx3 uint8 BGR, decoded here
    (zlib and the five PNG row filters), independently of the engine's decoder."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat = 8, b""
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos:pos + 4])
        kind, payload = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            w, h, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", payload)
            assert depth == 8 and color in (2, 6) and interlace == 0, (depth, color, interlace)
        elif kind == b"IDAT":
            idat += payload
        pos += 12 + n
    bpp = 3 if color == 2 else 4
    raw = np.frombuffer(zlib.decompress(idat), dtype=np.uint8).reshape(h, 1 + w * bpp)
    out = np.zeros((h, w * bpp), dtype=np.int32)
    prev = np.zeros(w * bpp, dtype=np.int32)
    for y in range(h):
        f, line = raw[y, 0], raw[y, 1:].astype(np.int32)
        cur = np.zeros(w * bpp, dtype=np.int32)
        for x in range(w * bpp):
            a = cur[x - bpp] if x >= bpp else 0
            b = prev[x]
            c = prev[x - bpp] if x >= bpp else 0
            if f == 0:
                pred = 0
            elif f == 1:
                pred = a
            elif f == 2:
                pred = b
            elif f == 3:
                pred = (a + b) // 2
            else:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
            cur[x] = (line[x] + pred) & 0xFF
        out[y] = cur
        prev = cur
    rgb = out.reshape(h, w, bpp)[..., :3].astype(np.uint8)
    return np.ascontiguousarray(rgb[..., ::-1])


@pytest.fixture(scope="session")
def golden_dump(tmp_path_factory):
    """`bevformer golden` of the micro set with --dump: what the CLI detects on its three frames."""
    out = tmp_path_factory.mktemp("golden_dump")
    subprocess.run([CLI, "-q", "golden", MICRO, "--threads", "1", "--dump", str(out)], check=True,
                   stdout=subprocess.DEVNULL)
    return [read_safetensors(os.path.join(out, f"frame{k}.safetensors")) for k in range(3)]


def assert_same_detections(a, b):
    """Two Results (or a Result and golden det.* tensors) with the same boxes, bit for bit."""
    if isinstance(b, dict):
        np.testing.assert_array_equal(a.boxes, b["det.boxes_3d"])
        np.testing.assert_array_equal(a.scores, b["det.scores_3d"])
        np.testing.assert_array_equal(a.labels, b["det.labels_3d"])
        np.testing.assert_array_equal(a.query, b["det.query_index"])
        return
    np.testing.assert_array_equal(a.boxes, b.boxes)
    np.testing.assert_array_equal(a.scores, b.scores)
    np.testing.assert_array_equal(a.labels, b.labels)
    np.testing.assert_array_equal(a.query, b.query)
    assert a.used_history == b.used_history
