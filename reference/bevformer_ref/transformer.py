"""PerceptionTransformer: BEV encoder (TSA + SCA), detection decoder, and the geometry they use.

Batch size 1 throughout (what forward_test runs). Tensor layouts and the order of float32 ops
follow the upstream modules (spec sections 2.4-2.12); module and parameter names follow the
official state_dict keys.
"""

from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .config import ModelCfg


# ---------------------------------------------------------------------------------------------
# Multi-scale deformable sampling (spec 2.12)

def ms_deform_attn(value: torch.Tensor, shapes: Sequence[Tuple[int, int]], loc: torch.Tensor,
                   weights: torch.Tensor) -> torch.Tensor:
    """value (B, sum h*w, heads, hd); loc (B, Q, heads, L, P, 2) normalized (x, y) with
    align_corners=False (pixel = loc * size - 0.5); weights (B, Q, heads, L, P).
    Bilinear with zero padding via grid_sample. Returns (B, Q, heads*hd)."""
    b, _, nh, hd = value.shape
    _, q, _, nl, npnt, _ = loc.shape
    per_level = value.split([h * w for h, w in shapes], dim=1)
    grids = 2 * loc - 1
    sampled = []
    for lvl, (h, w) in enumerate(shapes):
        v = per_level[lvl].flatten(2).transpose(1, 2).reshape(b * nh, hd, h, w)
        g = grids[:, :, :, lvl].transpose(1, 2).flatten(0, 1)  # (B*heads, Q, P, 2)
        sampled.append(F.grid_sample(v, g, mode="bilinear", padding_mode="zeros", align_corners=False))
    a = weights.transpose(1, 2).reshape(b * nh, 1, q, nl * npnt)
    out = (torch.stack(sampled, dim=-2).flatten(-2) * a).sum(-1).view(b, nh * hd, q)
    return out.transpose(1, 2).contiguous()


def _normalizer(shapes: Sequence[Tuple[int, int]], device) -> torch.Tensor:
    """(L, 2) = (w, h) per level, as a float division by the int64 spatial shapes gives."""
    return torch.tensor([[w, h] for h, w in shapes], dtype=torch.int64, device=device)


class FFN(nn.Module):
    """mmcv FFN: x + Linear2(ReLU(Linear1(x))); keys layers.0.0 and layers.1."""

    def __init__(self, dims: int, hidden: int):
        super().__init__()
        self.layers = nn.Sequential(nn.Sequential(nn.Linear(dims, hidden), nn.ReLU(), nn.Dropout(0.0)),
                                    nn.Linear(hidden, dims), nn.Dropout(0.0))

    def forward(self, x):
        return x + self.layers(x)


# ---------------------------------------------------------------------------------------------
# Encoder attentions

class TemporalSelfAttention(nn.Module):
    def __init__(self, dims, heads, levels, points, queue=2):
        super().__init__()
        self.heads, self.levels, self.points, self.queue = heads, levels, points, queue
        self.sampling_offsets = nn.Linear(dims * queue, queue * heads * levels * points * 2)
        self.attention_weights = nn.Linear(dims * queue, queue * heads * levels * points)
        self.value_proj = nn.Linear(dims, dims)
        self.output_proj = nn.Linear(dims, dims)

    def forward(self, x, value, pos, ref_2d, shapes):
        """x (1, HW, C) the layer input; value (2, HW, C) = [prev BEV, current] or None (then
        [x, x]); pos (1, HW, C); ref_2d (2, HW, 1, 2); shapes [(bev_h, bev_w)]."""
        bs, nq, c = x.shape
        identity = x
        if value is None:
            value = torch.stack([x, x], 1).reshape(bs * 2, nq, c)
        query = torch.cat([value[:bs], x + pos], -1)
        v = self.value_proj(value).view(bs * self.queue, -1, self.heads, c // self.heads)
        nh, nl, npnt, qu = self.heads, self.levels, self.points, self.queue
        off = self.sampling_offsets(query).view(bs, nq, nh, qu, nl, npnt, 2)
        aw = self.attention_weights(query).view(bs, nq, nh, qu, nl * npnt).softmax(-1)
        aw = aw.view(bs, nq, nh, qu, nl, npnt).permute(0, 3, 1, 2, 4, 5).reshape(bs * qu, nq, nh, nl, npnt)
        off = off.permute(0, 3, 1, 2, 4, 5, 6).reshape(bs * qu, nq, nh, nl, npnt, 2)
        norm = _normalizer(shapes, x.device)
        loc = ref_2d[:, :, None, :, None, :] + off / norm[None, None, None, :, None, :]
        out = ms_deform_attn(v, shapes, loc, aw)  # (bs*queue, HW, C)
        out = out.permute(1, 2, 0).reshape(nq, c, bs, qu).mean(-1).permute(2, 0, 1)
        return self.output_proj(out) + identity


class MSDeformableAttention3D(nn.Module):
    """SCA's inner attention: no output_proj, no residual; point p pairs with pillar p % D."""

    def __init__(self, dims, heads, levels, points):
        super().__init__()
        self.heads, self.levels, self.points = heads, levels, points
        self.sampling_offsets = nn.Linear(dims, heads * levels * points * 2)
        self.attention_weights = nn.Linear(dims, heads * levels * points)
        self.value_proj = nn.Linear(dims, dims)

    def forward(self, query, value, ref, shapes):
        """query (B, Q, C); value (B, L_tot, C); ref (B, Q, D, 2)."""
        b, q, c = query.shape
        nh, nl, npnt = self.heads, self.levels, self.points
        v = self.value_proj(value).view(b, value.shape[1], nh, c // nh)
        off = self.sampling_offsets(query).view(b, q, nh, nl, npnt, 2)
        aw = self.attention_weights(query).view(b, q, nh, nl * npnt).softmax(-1).view(b, q, nh, nl, npnt)
        d = ref.shape[2]
        off = off / _normalizer(shapes, query.device)[None, None, None, :, None, :]
        loc = ref[:, :, None, None, None, :, :] + off.view(b, q, nh, nl, npnt // d, d, 2)
        return ms_deform_attn(v, shapes, loc.view(b, q, nh, nl, npnt, 2), aw)


class SpatialCrossAttention(nn.Module):
    def __init__(self, dims, heads, levels, points):
        super().__init__()
        self.deformable_attention = MSDeformableAttention3D(dims, heads, levels, points)
        self.output_proj = nn.Linear(dims, dims)

    def forward(self, x, feats, ref_cam, bev_mask, shapes, plan=None):
        """x (1, HW, C); feats (N, L_tot, C); ref_cam (N, 1, HW, D, 2); bev_mask (N, 1, HW, D).
        Each camera attends only the BEV cells it sees (rebatched, zero-padded to max_len)."""
        bs, nq, c = x.shape
        n_cam = feats.shape[0]
        if plan is None:
            plan = sca_plan(ref_cam, bev_mask)
        index, max_len, count = plan["index"], plan["max_len"], plan["count"]
        d = ref_cam.shape[3]
        queries = x.new_zeros(n_cam, max_len, c)
        refs = ref_cam.new_zeros(n_cam, max_len, d, 2)
        for i, idx in enumerate(index):
            queries[i, : len(idx)] = x[0, idx]
            refs[i, : len(idx)] = ref_cam[i, 0, idx]
        out = self.deformable_attention(queries, feats, refs, shapes)
        slots = torch.zeros_like(x)
        for i, idx in enumerate(index):
            slots[0, idx] += out[i, : len(idx)]
        slots = slots / count[..., None]
        return self.output_proj(slots) + x


def sca_plan(ref_cam, bev_mask):
    index = [m[0].sum(-1).nonzero().squeeze(-1) for m in bev_mask]
    max_len = max(max(len(i) for i in index), 1)
    count = (bev_mask.sum(-1) > 0).permute(1, 2, 0).sum(-1)
    count = torch.clamp(count, min=1.0)
    return {"index": index, "max_len": max_len, "count": count}


class BEVFormerLayer(nn.Module):
    def __init__(self, cfg: ModelCfg):
        super().__init__()
        t = cfg.transformer
        c = t.embed_dims
        self.attentions = nn.ModuleList([
            TemporalSelfAttention(c, t.tsa.num_heads, t.tsa.num_levels, t.tsa.num_points, t.tsa_num_bev_queue),
            SpatialCrossAttention(c, t.sca.num_heads, t.sca.num_levels, t.sca.num_points)])
        self.ffns = nn.ModuleList([FFN(c, t.encoder_ffn_dims)])
        self.norms = nn.ModuleList([nn.LayerNorm(c) for _ in range(3)])

    def forward(self, x, prev_stack, pos, ref_2d, bev_shape, feats, ref_cam, bev_mask, shapes, plan):
        x = self.norms[0](self.attentions[0](x, prev_stack, pos, ref_2d, [bev_shape]))
        x = self.norms[1](self.attentions[1](x, feats, ref_cam, bev_mask, shapes, plan))
        return self.norms[2](self.ffns[0](x))


class BEVFormerEncoder(nn.Module):
    def __init__(self, cfg: ModelCfg):
        super().__init__()
        self.layers = nn.ModuleList([BEVFormerLayer(cfg) for _ in range(cfg.transformer.encoder_layers)])


# ---------------------------------------------------------------------------------------------
# Decoder

class CustomMSDeformableAttention(nn.Module):
    def __init__(self, dims, heads, levels, points):
        super().__init__()
        self.heads, self.levels, self.points = heads, levels, points
        self.sampling_offsets = nn.Linear(dims, heads * levels * points * 2)
        self.attention_weights = nn.Linear(dims, heads * levels * points)
        self.value_proj = nn.Linear(dims, dims)
        self.output_proj = nn.Linear(dims, dims)

    def forward(self, x, pos, value, ref, shapes):
        """Sequence-first: x, pos (Q, 1, C); value (HW, 1, C); ref (1, Q, L, 2)."""
        identity = x
        query = (x + pos).permute(1, 0, 2)
        value = value.permute(1, 0, 2)
        b, q, c = query.shape
        nh, nl, npnt = self.heads, self.levels, self.points
        v = self.value_proj(value).view(b, value.shape[1], nh, c // nh)
        off = self.sampling_offsets(query).view(b, q, nh, nl, npnt, 2)
        aw = self.attention_weights(query).view(b, q, nh, nl * npnt).softmax(-1).view(b, q, nh, nl, npnt)
        loc = ref[:, :, None, :, None, :] + off / _normalizer(shapes, x.device)[None, None, None, :, None, :]
        out = self.output_proj(ms_deform_attn(v, shapes, loc, aw))
        return out.permute(1, 0, 2) + identity


class MultiheadAttention(nn.Module):
    """mmcv's wrapper: q = k = x + pos, v = x, nn.MultiheadAttention (key attn.*), + x."""

    def __init__(self, dims, heads):
        super().__init__()
        self.attn = nn.MultiheadAttention(dims, heads, dropout=0.0)

    def forward(self, x, pos):
        qk = x + pos
        return x + self.attn(qk, qk, x, need_weights=False)[0]


class DetrTransformerDecoderLayer(nn.Module):
    def __init__(self, cfg: ModelCfg):
        super().__init__()
        t = cfg.transformer
        c = t.embed_dims
        a = t.decoder_cross
        self.attentions = nn.ModuleList([MultiheadAttention(c, t.decoder_self_attn_heads),
                                         CustomMSDeformableAttention(c, a.num_heads, a.num_levels, a.num_points)])
        self.ffns = nn.ModuleList([FFN(c, t.decoder_ffn_dims)])
        self.norms = nn.ModuleList([nn.LayerNorm(c) for _ in range(3)])

    def forward(self, x, pos, value, ref, shapes):
        x = self.norms[0](self.attentions[0](x, pos))
        x = self.norms[1](self.attentions[1](x, pos, value, ref, shapes))
        return self.norms[2](self.ffns[0](x))


def inverse_sigmoid(x, eps=1e-5):
    x = x.clamp(min=0, max=1)
    return torch.log(x.clamp(min=eps) / (1 - x).clamp(min=eps))


class DetectionTransformerDecoder(nn.Module):
    def __init__(self, cfg: ModelCfg):
        super().__init__()
        self.layers = nn.ModuleList([DetrTransformerDecoderLayer(cfg) for _ in range(cfg.transformer.decoder_layers)])

    def forward(self, query, pos, value, ref, bev_shape, reg_branches=None):
        """query, pos (Q, 1, C); value (HW, 1, C); ref (1, Q, 3) sigmoid. Returns the stacked
        layer outputs (L, Q, 1, C) and references after each layer (L, 1, Q, 3)."""
        x = query
        states, refs = [], []
        for lid, layer in enumerate(self.layers):
            x = layer(x, pos, value, ref[..., :2].unsqueeze(2), [bev_shape])
            if reg_branches is not None:
                t = reg_branches[lid](x.permute(1, 0, 2))
                new = torch.zeros_like(ref)
                new[..., :2] = t[..., :2] + inverse_sigmoid(ref[..., :2])
                new[..., 2:3] = t[..., 4:5] + inverse_sigmoid(ref[..., 2:3])
                ref = new.sigmoid().detach()
            states.append(x)
            refs.append(ref)
        return torch.stack(states), torch.stack(refs)


# ---------------------------------------------------------------------------------------------
# Geometry (spec 2.6-2.8)

def bev_shift(can_bus: np.ndarray, cfg: ModelCfg) -> np.ndarray:
    """Float64 as upstream (numpy), returned as float32 [shift_x, shift_y]."""
    bev_h, bev_w = cfg.head.bev_h, cfg.head.bev_w
    pc = cfg.head.pc_range  # BEVFormerHead.real_w / real_h come from the bbox coder's pc_range
    real_w, real_h = pc[3] - pc[0], pc[4] - pc[1]
    grid_length_y, grid_length_x = real_h / bev_h, real_w / bev_w
    dx, dy = float(can_bus[0]), float(can_bus[1])
    ego_angle = float(can_bus[-2]) / np.pi * 180
    length = np.sqrt(dx ** 2 + dy ** 2)
    trans_angle = np.arctan2(dy, dx) / np.pi * 180
    bev_angle = ego_angle - trans_angle
    shift_y = length * np.cos(bev_angle / 180 * np.pi) / grid_length_y / bev_h
    shift_x = length * np.sin(bev_angle / 180 * np.pi) / grid_length_x / bev_w
    use = 1.0 if cfg.transformer.use_shift else 0.0
    return np.array([shift_x * use, shift_y * use], dtype=np.float64).astype(np.float32)


def rotate_nearest(img: torch.Tensor, angle_deg: float, center: Sequence[float]) -> torch.Tensor:
    """torchvision.transforms.functional.rotate(img (C, H, W), angle, NEAREST, expand=False,
    center, zero fill): the inverse affine map in float64, then a float32 affine grid and
    grid_sample(nearest, zeros, align_corners=False) (spec 2.6)."""
    c, h, w = img.shape
    cx, cy = center[0] - w * 0.5, center[1] - h * 0.5  # centre relative to the image centre
    a = math.radians(angle_deg)
    ca, sa = math.cos(a), math.sin(a)
    # output -> input: [xi, yi] = R(a) [xo - cx, yo - cy] + [cx, cy]
    m = [ca, -sa, 0.0, sa, ca, 0.0]
    m[2] = m[0] * -cx + m[1] * -cy + cx
    m[5] = m[3] * -cx + m[4] * -cy + cy
    theta = torch.tensor(m, dtype=torch.float64).view(1, 2, 3).to(img.dtype)
    xs = torch.linspace(-w * 0.5 + 0.5, w * 0.5 + 0.5 - 1, steps=w, dtype=img.dtype)
    ys = torch.linspace(-h * 0.5 + 0.5, h * 0.5 + 0.5 - 1, steps=h, dtype=img.dtype).unsqueeze(-1)
    base = torch.empty(1, h, w, 3, dtype=img.dtype)
    base[..., 0].copy_(xs)
    base[..., 1].copy_(ys)
    base[..., 2].fill_(1)
    scaled = theta.transpose(1, 2) / torch.tensor([0.5 * w, 0.5 * h], dtype=img.dtype)
    grid = base.view(1, h * w, 3).bmm(scaled).view(1, h, w, 2)
    out = F.grid_sample(img.unsqueeze(0), grid, mode="nearest", padding_mode="zeros", align_corners=False)
    return out[0]


def reference_points_3d(cfg: ModelCfg) -> torch.Tensor:
    """(1, D, HW, 3) normalized (x, y, z), q = row * bev_w + col."""
    h, w = cfg.head.bev_h, cfg.head.bev_w
    pc = cfg.transformer.pc_range
    z = pc[5] - pc[2]
    d = cfg.transformer.num_points_in_pillar
    zs = torch.linspace(0.5, z - 0.5, d).view(-1, 1, 1).expand(d, h, w) / z
    xs = torch.linspace(0.5, w - 0.5, w).view(1, 1, w).expand(d, h, w) / w
    ys = torch.linspace(0.5, h - 0.5, h).view(1, h, 1).expand(d, h, w) / h
    ref = torch.stack((xs, ys, zs), -1).view(d, h * w, 3)
    return ref[None]


def reference_points_2d(cfg: ModelCfg) -> torch.Tensor:
    """(1, HW, 1, 2) = ((col + 0.5) / W, (row + 0.5) / H)."""
    h, w = cfg.head.bev_h, cfg.head.bev_w
    ys = (torch.linspace(0.5, h - 0.5, h) / h).view(h, 1).expand(h, w)
    xs = (torch.linspace(0.5, w - 0.5, w) / w).view(1, w).expand(h, w)
    return torch.stack((xs.reshape(-1), ys.reshape(-1)), -1)[None, :, None, :]


def point_sampling(ref_3d: torch.Tensor, cfg: ModelCfg, lidar2img: np.ndarray, pad_hw: Tuple[int, int]):
    """Project every pillar anchor into every camera (fp32). Returns reference_points_cam
    (N, 1, HW, D, 2) as (u / W_pad, v / H_pad) and bev_mask (N, 1, HW, D) bool."""
    pc = cfg.transformer.pc_range
    p = ref_3d.clone()
    p[..., 0:1] = p[..., 0:1] * (pc[3] - pc[0]) + pc[0]
    p[..., 1:2] = p[..., 1:2] * (pc[4] - pc[1]) + pc[1]
    p[..., 2:3] = p[..., 2:3] * (pc[5] - pc[2]) + pc[2]
    p = torch.cat((p, torch.ones_like(p[..., :1])), -1)  # (1, D, HW, 4)
    p = p.permute(1, 0, 2, 3)  # (D, 1, HW, 4)
    d, b, nq, _ = p.shape
    l2i = torch.from_numpy(np.asarray(lidar2img, dtype=np.float64)).to(torch.float32)  # (N, 4, 4)
    n = l2i.shape[0]
    p = p.view(d, b, 1, nq, 4).repeat(1, 1, n, 1, 1).unsqueeze(-1)
    l2i = l2i.view(1, b, n, 1, 4, 4).repeat(d, 1, 1, nq, 1, 1)
    cam = torch.matmul(l2i, p).squeeze(-1)  # (D, 1, N, HW, 4)
    eps = 1e-5
    mask = cam[..., 2:3] > eps
    uv = cam[..., 0:2] / torch.maximum(cam[..., 2:3], torch.ones_like(cam[..., 2:3]) * eps)
    uv[..., 0] /= pad_hw[1]
    uv[..., 1] /= pad_hw[0]
    mask = mask & (uv[..., 1:2] > 0.0) & (uv[..., 1:2] < 1.0) & (uv[..., 0:1] < 1.0) & (uv[..., 0:1] > 0.0)
    mask = torch.nan_to_num(mask)
    return uv.permute(2, 1, 3, 0, 4), mask.permute(2, 1, 3, 0, 4).squeeze(-1)


# ---------------------------------------------------------------------------------------------

class PerceptionTransformer(nn.Module):
    def __init__(self, cfg: ModelCfg):
        super().__init__()
        t = cfg.transformer
        c = t.embed_dims
        self.cfg = cfg
        self.encoder = BEVFormerEncoder(cfg)
        self.decoder = DetectionTransformerDecoder(cfg)
        self.level_embeds = nn.Parameter(torch.zeros(t.num_feature_levels, c))
        self.cams_embeds = nn.Parameter(torch.zeros(t.num_cams, c))
        self.reference_points = nn.Linear(c, 3)
        self.can_bus_mlp = nn.Sequential(nn.Linear(18, c // 2), nn.ReLU(), nn.Linear(c // 2, c), nn.ReLU())
        if t.can_bus_norm:
            self.can_bus_mlp.add_module("norm", nn.LayerNorm(c))

    def flatten_features(self, feats: List[torch.Tensor]):
        """feats: per level (N, C, h, w). Returns feat_flatten (N, L_tot, C), spatial shapes
        [(h, w)] and level start indices."""
        flat, shapes = [], []
        for lvl, f in enumerate(feats):
            n, c, h, w = f.shape
            shapes.append((h, w))
            f = f.flatten(2).permute(0, 2, 1)  # (N, hw, C)
            if self.cfg.transformer.use_cams_embeds:
                f = f + self.cams_embeds[:, None, :].to(f.dtype)
            f = f + self.level_embeds[None, lvl:lvl + 1, :].to(f.dtype)
            flat.append(f)
        starts = [0]
        for h, w in shapes[:-1]:
            starts.append(starts[-1] + h * w)
        return torch.cat(flat, 1), shapes, starts

    def encode(self, bev_queries, bev_pos, feat, shapes, can_bus, prev_bev, shift, geom, taps=None):
        """bev_queries (HW, C); bev_pos (HW, C); feat (N, L_tot, C); can_bus float64[18] after
        the test-time delta; prev_bev (HW, 1, C) or None; shift float32[2]; geom: the rig's
        point sampling (ref_cam, bev_mask, plan). Returns bev_embed (HW, 1, C)."""
        cfg, t = self.cfg, self.cfg.transformer
        bev_h, bev_w = cfg.head.bev_h, cfg.head.bev_w
        hw, c = bev_queries.shape
        q = bev_queries.unsqueeze(1)  # (HW, 1, C)
        pos = bev_pos.unsqueeze(1)
        if prev_bev is not None and t.rotate_prev_bev:
            img = prev_bev[:, 0].reshape(bev_h, bev_w, c).permute(2, 0, 1)
            img = rotate_nearest(img, float(can_bus[-1]), t.rotate_center)
            prev_bev = img.permute(1, 2, 0).reshape(hw, 1, c)
        if taps is not None and prev_bev is not None:
            taps["dbg.prev_bev_rotated"] = prev_bev
        cb = torch.from_numpy(np.asarray(can_bus, dtype=np.float64)).to(torch.float32)[None]
        cb = self.can_bus_mlp(cb)[None]  # (1, 1, C)
        q = q + cb * float(t.use_can_bus)
        if taps is not None:
            taps["dbg.bev_query_in"] = q
            taps["dbg.bev_pos"] = pos
            taps["dbg.shift"] = torch.from_numpy(np.asarray(shift, dtype=np.float32)).view(1, 2)

        ref_2d = reference_points_2d(cfg)
        sh = torch.from_numpy(np.asarray(shift, dtype=np.float32)).view(1, 1, 1, 2)
        if t.shift_ref_2d_alias:  # the original release: ref_2d itself is shifted
            ref_2d = ref_2d + sh
            shift_ref_2d = ref_2d
        else:
            shift_ref_2d = ref_2d + sh
        x = q.permute(1, 0, 2)  # (1, HW, C)
        pos = pos.permute(1, 0, 2)
        if prev_bev is not None:
            prev_stack = torch.stack([prev_bev.permute(1, 0, 2), x], 1).reshape(2, hw, c)
            hybrid = torch.stack([shift_ref_2d, ref_2d], 1).reshape(2, hw, 1, 2)
        else:
            prev_stack = None
            hybrid = torch.stack([ref_2d, ref_2d], 1).reshape(2, hw, 1, 2)
        ref_cam, bev_mask, plan = geom
        for lid, layer in enumerate(self.encoder.layers):
            x = layer(x, prev_stack, pos, hybrid, (bev_h, bev_w), feat, ref_cam, bev_mask, shapes, plan)
            if taps is not None:
                taps[f"dbg.enc_layer.{lid}"] = x
        return x.permute(1, 0, 2)  # (HW, 1, C)

    def decode(self, query_embedding, bev_embed, reg_branches, taps=None):
        c = self.cfg.transformer.embed_dims
        query_pos, query = torch.split(query_embedding, c, dim=1)
        ref = self.reference_points(query_pos[None]).sigmoid()  # (1, Q, 3)
        if taps is not None:
            taps["dbg.init_reference"] = ref
        states, refs = self.decoder(query.unsqueeze(1), query_pos.unsqueeze(1), bev_embed, ref,
                                    (self.cfg.head.bev_h, self.cfg.head.bev_w), reg_branches)
        return states, ref, refs
