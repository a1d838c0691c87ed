"""The BEVFormer detector: image stage, forward_test's history state machine, preprocessing."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .backbone import FPN, ResNet
from .config import ModelCfg
from .head import BEVFormerHead, decode
from .tensorio import load_state_dict
from .transformer import point_sampling, reference_points_3d, sca_plan, bev_shift


@dataclass
class Frame:
    img: torch.Tensor                # (N, 3, H_pad, W_pad) float32, normalized, zero padded
    lidar2img: np.ndarray            # (N, 4, 4) float64 at the network input's scale
    can_bus: np.ndarray              # (18,) float64, raw (before the test-time delta)
    scene_token: str = "scene"


@dataclass
class History:
    """forward_test's state: prev_bev, scene_token, prev_pos, prev_angle."""
    prev_bev: Optional[torch.Tensor] = None
    scene_token: Optional[str] = None
    prev_pos: np.ndarray = field(default_factory=lambda: np.zeros(3))
    prev_angle: float = 0.0


class BEVFormer(nn.Module):
    def __init__(self, cfg: ModelCfg):
        super().__init__()
        self.cfg = cfg
        self.img_backbone = ResNet(cfg.backbone)
        self.img_neck = FPN(cfg.neck)
        self.pts_bbox_head = BEVFormerHead(cfg)
        self.history = History()
        self._rig = None  # (lidar2img, pad_hw, ref_cam, bev_mask, plan)
        self.eval()

    # ---- weights ----

    def load_weights(self, path: str) -> Dict[str, List[str]]:
        sd, _ = load_state_dict(path)
        own = self.state_dict()
        optional = lambda k: k.endswith("num_batches_tracked") or k == "pts_bbox_head.code_weights"
        missing = [k for k in own if k not in sd and not optional(k)]
        unexpected = [k for k in sd if k not in own]
        wrong = [f"{k}: file {list(sd[k].shape)}, model {list(own[k].shape)}"
                 for k in own if k in sd and tuple(sd[k].shape) != tuple(own[k].shape)]
        if missing or unexpected or wrong:
            lines = [f"{path} does not fit the config:"]
            for title, items in (("missing", missing), ("unexpected", unexpected), ("wrong shape", wrong)):
                if items:
                    lines.append(f"  {title} ({len(items)}): " + ", ".join(items[:20]) + (" ..." if len(items) > 20 else ""))
            raise ValueError("\n".join(lines))
        self.load_state_dict({k: v.to(own[k].dtype) for k, v in sd.items()}, strict=False)
        return {"missing_optional": [k for k in own if k not in sd]}

    # ---- stages ----

    def extract_img_feat(self, img: torch.Tensor, taps=None) -> List[torch.Tensor]:
        feats = self.img_backbone(img)
        outs = self.img_neck(feats)
        if taps is not None:
            taps["img"] = img
            for i, f in enumerate(feats):
                taps[f"backbone.{i}"] = f
            for i, f in enumerate(outs):
                taps[f"neck.{i}"] = f
        return outs

    def rig_geometry(self, lidar2img: np.ndarray, pad_hw):
        l2i = np.asarray(lidar2img, dtype=np.float64)
        if self._rig is None or self._rig[1] != tuple(pad_hw) or not np.array_equal(self._rig[0], l2i):
            ref_cam, mask = point_sampling(reference_points_3d(self.cfg), self.cfg, l2i, pad_hw)
            self._rig = (l2i.copy(), tuple(pad_hw), ref_cam, mask, sca_plan(ref_cam, mask))
        return self._rig[2:]

    def temporal_step(self, frame: Frame):
        """forward_test steps 1-3: returns (can_bus after the delta, prev_bev or None) and
        remembers the raw position and angle."""
        h = self.history
        if frame.scene_token != h.scene_token:
            h.prev_bev = None
        h.scene_token = frame.scene_token
        if not self.cfg.video_test_mode:
            h.prev_bev = None
        can = np.array(frame.can_bus, dtype=np.float64).copy()
        tmp_pos, tmp_angle = can[:3].copy(), float(can[-1])
        if h.prev_bev is not None:
            can[:3] -= h.prev_pos
            can[-1] -= h.prev_angle
        else:
            can[-1] = 0
            can[:3] = 0
        h.prev_pos, h.prev_angle = tmp_pos, tmp_angle
        return can, h.prev_bev

    @torch.no_grad()
    def forward_frame(self, frame: Frame, taps: Optional[Dict[str, torch.Tensor]] = None):
        """One frame of forward_test. Returns the decoded detections (dict of tensors) and, when
        taps is a dict, fills it with every stage tensor under the golden sets' names."""
        cfg = self.cfg
        head = self.pts_bbox_head
        tr = head.transformer
        can, prev_bev = self.temporal_step(frame)
        if taps is not None:
            taps["dbg.can_bus"] = torch.from_numpy(can.copy())
        feats = self.extract_img_feat(frame.img, taps)
        feat, shapes, starts = tr.flatten_features(feats)
        if taps is not None:
            taps["dbg.spatial_shapes"] = torch.tensor(shapes, dtype=torch.int64)
            taps["dbg.level_start_index"] = torch.tensor(starts, dtype=torch.int64)
        pad_hw = (frame.img.shape[2], frame.img.shape[3])
        ref_cam, mask, plan = self.rig_geometry(frame.lidar2img, pad_hw)
        if taps is not None:
            taps["dbg.reference_points_cam"] = ref_cam
            taps["dbg.bev_mask"] = mask.to(torch.uint8)
            taps["dbg.bev_mask_count"] = torch.tensor([len(i) for i in plan["index"]], dtype=torch.int64)
        bev_h, bev_w = cfg.head.bev_h, cfg.head.bev_w
        bev_queries = head.bev_embedding.weight
        bev_pos = head.positional_encoding(bev_h, bev_w)
        shift = bev_shift(can, cfg)
        bev_embed = tr.encode(bev_queries, bev_pos, feat, shapes, can, prev_bev, shift, (ref_cam, mask, plan), taps)
        reg = head.reg_branches if cfg.head.with_box_refine else None
        states, init_ref, refs = tr.decode(head.query_embedding.weight, bev_embed, reg, taps)
        all_cls, all_preds = head.predictions(states, init_ref, refs)
        dets = decode(cfg, all_cls[-1, 0], all_preds[-1, 0])
        if taps is not None:
            taps["bev_embed"] = bev_embed
            taps["dbg.inter_states"] = states
            taps["dbg.inter_references"] = refs
            taps["all_cls_scores"] = all_cls
            taps["all_bbox_preds"] = all_preds
            taps.update(dets)
        # forward_test step 4: the encoder output is the next frame's prev_bev.
        self.history.prev_bev = bev_embed
        return dets

    def reset(self):
        self.history = History()


def build(cfg: ModelCfg, weights: Optional[str] = None) -> BEVFormer:
    m = BEVFormer(cfg)
    if weights:
        m.load_weights(weights)
    return m.eval()


# ---------------------------------------------------------------------------------------------
# Preprocessing (spec 2.1): uint8 RGB images -> the network input

def preprocess(images_rgb: Sequence[np.ndarray], cfg: ModelCfg, lidar2img: Optional[np.ndarray] = None):
    """RGB uint8 (H, W, 3) per camera, as decoded -> (img (N, 3, H_pad, W_pad), lidar2img scaled).
    mmcv reads BGR; to_rgb swaps back. Normalize (float32) at full size, then resize with
    half-pixel-centred bilinear (cv2.INTER_LINEAR, no antialias), then zero-pad to the divisor."""
    im = cfg.image
    s = im.resize_scale
    outs = []
    for rgb in images_rgb:
        x = torch.from_numpy(np.ascontiguousarray(rgb[:, :, ::-1])).to(torch.float32)  # BGR
        if im.to_rgb:
            x = x.flip(-1)
        x = (x - torch.tensor(im.mean, dtype=torch.float32)) * (1.0 / torch.tensor(im.std, dtype=torch.float64)).float()
        x = x.permute(2, 0, 1)
        h, w = x.shape[1:]
        if s != 1.0:
            x = F.interpolate(x[None], size=(int(h * s), int(w * s)), mode="bilinear", align_corners=False)[0]
        d = im.size_divisor
        ph, pw = (x.shape[1] + d - 1) // d * d, (x.shape[2] + d - 1) // d * d
        x = F.pad(x, (0, pw - x.shape[2], 0, ph - x.shape[1]))
        outs.append(x)
    img = torch.stack(outs)
    if lidar2img is not None and s != 1.0:
        lidar2img = np.diag([s, s, 1.0, 1.0]) @ np.asarray(lidar2img, dtype=np.float64)
    return img, lidar2img
