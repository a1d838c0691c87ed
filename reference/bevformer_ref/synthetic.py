"""Synthetic inputs on a nuScenes-like six-camera rig, the same as bevformer.cpp's
src/model/synthetic.cpp (synthetic_rig and the can_bus of synthetic_frame)."""

from __future__ import annotations

import math

import numpy as np
import torch

from .config import ModelCfg
from .model import Frame


def synthetic_rig(cfg: ModelCfg) -> np.ndarray:
    """lidar2img (N, 4, 4) of cameras looking front, front-right, front-left, back, back-left,
    back-right (nuScenes slot order), 0.3 m below the lidar, a 70-degree-wide pinhole on the
    config's resized image."""
    w, h = cfg.image.resized_wh()
    fx = w / 2.0 / math.tan(35.0 * math.pi / 180.0)
    yaws = [0, -55, 55, 180, 110, -110]  # CCW from lidar +y (forward)
    out = []
    for i in range(cfg.transformer.num_cams):
        th = yaws[i % 6] * math.pi / 180.0
        axes = np.array([[math.cos(th), math.sin(th), 0.0],  # x_cam: right
                         [0.0, 0.0, -1.0],                    # y_cam: down
                         [-math.sin(th), math.cos(th), 0.0]])  # z_cam: viewing direction
        t = np.array([0.0, 0.0, -0.3])
        cam_from_lidar = np.eye(4)
        cam_from_lidar[:3, :3] = axes
        cam_from_lidar[:3, 3] = -(axes @ t)
        k = np.eye(4)
        k[0, 0], k[0, 2], k[1, 1], k[1, 2] = fx, w / 2.0, fx, h / 2.0
        out.append(k @ cam_from_lidar)
    return np.stack(out)


def synthetic_frame(cfg: ModelCfg, index: int, generator: torch.Generator, rig=None) -> Frame:
    """Frame `index` of a drive: N(0, 1) pixels in the unpadded area (zero padding elsewhere),
    the ego moving 1 m forward and turning 2 degrees left per frame, one scene. (Pixels come from
    torch's generator, not the C++ one: only their distribution matters for timing.)"""
    pw, ph = cfg.image.padded_wh()
    w, h = cfg.image.resized_wh()
    n = cfg.transformer.num_cams
    img = torch.zeros(n, 3, ph, pw)
    img[:, :, :h, :w] = torch.randn(n, 3, h, w, generator=generator)
    yaw_deg = 30.0 + 2.0 * index
    yaw = yaw_deg * math.pi / 180.0
    can = np.zeros(18)
    can[0] = 100.0 + index * math.cos(yaw)
    can[1] = 200.0 + index * math.sin(yaw)
    can[3], can[6] = math.cos(yaw / 2), math.sin(yaw / 2)
    can[16], can[17] = yaw, yaw_deg
    return Frame(img=img, lidar2img=synthetic_rig(cfg) if rig is None else rig, can_bus=can,
                 scene_token="synthetic")
