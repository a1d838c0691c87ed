#!/usr/bin/env python3
"""ctest cli_detect_video: `detect FRAMES... --video` and `--render x.jpg` as a user runs them.
Standard library only.

    check_detect_video.py BEVFORMER MICRO_DIR TMP

Three frames of the micro golden set on one stream. Checked:
  - --video out.mp4 is an MP4 a standard player opens: 'ftyp' first, a 'moov' whose video track is
    H.264 ('avc1' sample entry) with one sample per frame, at --video-fps;
  - --video out.avi is a RIFF AVI of Motion JPEG with one JPEG per frame;
  - --render x.jpg writes JPEGs (one per frame, x_<k>.jpg), not PNGs under a .jpg name;
  - an extension neither writer knows (--video x.gif, --render x.bmp) fails before the model loads
    (exit 2), naming the ones that work."""

import json
import os
import struct
import subprocess
import sys

binary, micro, tmp = sys.argv[1], sys.argv[2], sys.argv[3]
os.makedirs(tmp, exist_ok=True)
config = os.path.join(micro, "config.json")
weights = os.path.join(micro, "checkpoint.pth")

paths = []
for k in range(3):
    meta = json.load(open(os.path.join(micro, f"frame{k}_meta.json")))
    f = {"stream": "car", "timestamp": meta["timestamp"], "scene": "scene-1",
         "T_world_from_ego": meta["ego2global"], "T_ego_from_lidar": meta["lidar2ego"],
         "can_bus": meta["can_bus"], "cameras": []}
    for c in meta["cameras"]:
        f["cameras"].append({"name": c["name"], "image": os.path.join(micro, meta["img_filenames"][c["index"]]),
                             "K": c["cam2img"], "T_ego_from_cam": c["cam2ego"]})
    p = os.path.join(tmp, f"f{k}.json")
    json.dump(f, open(p, "w"))
    paths.append(p)


def detect(*args, expect=0):
    r = subprocess.run([binary, "detect", "--config", config, "--weights", weights, "--threads", "2", "--top", "0",
                        *paths, *args], capture_output=True, text=True)
    assert r.returncode == expect, f"exit {r.returncode}, expected {expect}: {r.stderr[-2000:]}"
    return r


def boxes(data, start=0, end=None):
    """The MP4 boxes (type, payload start, payload end) between start and end."""
    end = len(data) if end is None else end
    at = start
    while at + 8 <= end:
        size, kind = struct.unpack(">I4s", data[at:at + 8])
        head = 8
        if size == 1:
            size = struct.unpack(">Q", data[at + 8:at + 16])[0]
            head = 16
        assert size >= head and at + size <= end, f"box {kind} at {at} runs past its parent"
        yield kind.decode("latin-1"), at + head, at + size
        at += size


def find(data, path, start=0, end=None):
    kind, rest = path[0], path[1:]
    for k, b, e in boxes(data, start, end):
        if k == kind:
            return (b, e) if not rest else find(data, rest, b, e)
    raise AssertionError(f"no {kind} box")


# MP4 (H.264).
mp4 = os.path.join(tmp, "drive.mp4")
r = detect("--video", mp4, "--video-fps", "4", "--render", os.path.join(tmp, "x.jpg"))
assert "video: " in r.stdout and "3 frames" in r.stdout, r.stdout
data = open(mp4, "rb").read()
top = [k for k, _, _ in boxes(data)]
assert top[0] == "ftyp" and "moov" in top and "mdat" in top, top
stbl = find(data, ["moov", "trak", "mdia", "minf", "stbl"])
b, e = find(data, ["stsd"], *stbl)
entry = data[b + 8 + 4:b + 8 + 8].decode("latin-1")  # version/flags, count, then the first entry's size and type
assert entry == "avc1", f"video codec {entry!r}, expected H.264 'avc1'"
b, e = find(data, ["stsz"], *stbl)
samples = struct.unpack(">I", data[b + 8:b + 12])[0]
assert samples == 3, f"{samples} video samples, expected 3"
mdhd, _ = find(data, ["moov", "trak", "mdia", "mdhd"])
version = data[mdhd]
timescale, duration = (struct.unpack(">II", data[mdhd + 12:mdhd + 20]) if version == 0
                       else struct.unpack(">IQ", data[mdhd + 20:mdhd + 32]))
assert abs(duration / timescale - 0.75) < 1e-6, f"duration {duration / timescale} s, expected 3 frames at 4 fps"

# The pictures: JPEG bytes under .jpg.
for k in range(3):
    jpg = open(os.path.join(tmp, f"x_{k}.jpg"), "rb").read()
    assert jpg[:3] == b"\xff\xd8\xff" and jpg[-2:] == b"\xff\xd9", f"x_{k}.jpg is not a JPEG"

# AVI (Motion JPEG, OpenCV's own writer).
avi = os.path.join(tmp, "drive.avi")
detect("--video", avi)
data = open(avi, "rb").read()
assert data[:4] == b"RIFF" and data[8:12] == b"AVI ", "not a RIFF AVI"
assert b"MJPG" in data[:4096], "not Motion JPEG"
assert data.count(b"00dc") >= 3 and data.count(b"\xff\xd8\xff") >= 3, "fewer than 3 JPEG frames"

# Refused before the model loads: exit 2, the working formats named, nothing written.
r = detect("--video", os.path.join(tmp, "drive.gif"), expect=2)
assert ".mp4" in r.stderr and ".avi" in r.stderr and "loading" not in r.stderr, r.stderr
assert not os.path.exists(os.path.join(tmp, "drive.gif"))
r = detect("--render", os.path.join(tmp, "x.bmp"), expect=2)
assert ".jpg" in r.stderr and "loading" not in r.stderr, r.stderr
print("detect --video: mp4 (avc1, 3 samples, 0.75 s), avi (MJPG), --render .jpg, bad extensions refused: ok")
