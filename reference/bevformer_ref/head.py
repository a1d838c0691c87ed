"""BEVFormerHead (queries, positional encoding, cls/reg branches) and NMSFreeCoder (spec 2.13-2.14)."""

from __future__ import annotations

import copy
from typing import Dict

import torch
from torch import nn

from .config import ModelCfg
from .transformer import PerceptionTransformer, inverse_sigmoid


class LearnedPositionalEncoding(nn.Module):
    def __init__(self, num_feats, row_num_embed, col_num_embed):
        super().__init__()
        self.row_embed = nn.Embedding(row_num_embed, num_feats)
        self.col_embed = nn.Embedding(col_num_embed, num_feats)

    def forward(self, h: int, w: int) -> torch.Tensor:
        """(h*w, 2*num_feats): pos[row*w + col] = concat(col_embed[col], row_embed[row])."""
        x = self.col_embed(torch.arange(w))
        y = self.row_embed(torch.arange(h))
        pos = torch.cat((x.unsqueeze(0).repeat(h, 1, 1), y.unsqueeze(1).repeat(1, w, 1)), dim=-1)
        return pos.view(h * w, -1)


class BEVFormerHead(nn.Module):
    def __init__(self, cfg: ModelCfg):
        super().__init__()
        h, t = cfg.head, cfg.transformer
        c = t.embed_dims
        self.cfg = cfg
        self.transformer = PerceptionTransformer(cfg)
        self.bev_embedding = nn.Embedding(h.bev_h * h.bev_w, c)
        self.query_embedding = nn.Embedding(h.num_query, 2 * c)
        self.positional_encoding = LearnedPositionalEncoding(h.pos_num_feats, h.pos_row_num_embed, h.pos_col_num_embed)
        self.code_weights = nn.Parameter(torch.tensor(h.code_weights, dtype=torch.float32), requires_grad=False)
        cls = []
        for _ in range(h.num_reg_fcs):
            cls += [nn.Linear(c, c), nn.LayerNorm(c), nn.ReLU()]
        cls.append(nn.Linear(c, h.num_classes))
        reg = []
        for _ in range(h.num_reg_fcs):
            reg += [nn.Linear(c, c), nn.ReLU()]
        reg.append(nn.Linear(c, h.code_size))
        fc_cls, fc_reg = nn.Sequential(*cls), nn.Sequential(*reg)
        n = t.decoder_layers
        if h.with_box_refine:  # independent branches per decoder layer
            self.cls_branches = nn.ModuleList([copy.deepcopy(fc_cls) for _ in range(n)])
            self.reg_branches = nn.ModuleList([copy.deepcopy(fc_reg) for _ in range(n)])
        else:  # one module under every index
            self.cls_branches = nn.ModuleList([fc_cls for _ in range(n)])
            self.reg_branches = nn.ModuleList([fc_reg for _ in range(n)])

    def predictions(self, states, init_ref, refs):
        """states (L, Q, 1, C); init_ref (1, Q, 3); refs (L, 1, Q, 3). Returns
        all_cls_scores (L, 1, Q, classes) logits and all_bbox_preds (L, 1, Q, 10) with the
        centres in metres."""
        pc = self.cfg.head.pc_range
        hs = states.permute(0, 2, 1, 3)
        cls_out, reg_out = [], []
        for lvl in range(hs.shape[0]):
            ref = inverse_sigmoid(init_ref if lvl == 0 else refs[lvl - 1])
            logits = self.cls_branches[lvl](hs[lvl])
            t = self.reg_branches[lvl](hs[lvl])
            t[..., 0:2] += ref[..., 0:2]
            t[..., 0:2] = t[..., 0:2].sigmoid()
            t[..., 4:5] += ref[..., 2:3]
            t[..., 4:5] = t[..., 4:5].sigmoid()
            t[..., 0:1] = t[..., 0:1] * (pc[3] - pc[0]) + pc[0]
            t[..., 1:2] = t[..., 1:2] * (pc[4] - pc[1]) + pc[1]
            t[..., 4:5] = t[..., 4:5] * (pc[5] - pc[2]) + pc[2]
            cls_out.append(logits)
            reg_out.append(t)
        return torch.stack(cls_out), torch.stack(reg_out)


def decode(cfg: ModelCfg, cls_scores: torch.Tensor, bbox_preds: torch.Tensor) -> Dict[str, torch.Tensor]:
    """NMSFreeCoder.decode + get_bboxes for one sample of the last layer.
    cls_scores (Q, classes) logits, bbox_preds (Q, 10). Boxes [x, y, z_bottom, w, l, h, yaw, vx, vy]."""
    h = cfg.head
    scores, index = cls_scores.sigmoid().view(-1).topk(min(h.max_num, cls_scores.numel()))
    labels = index % h.num_classes
    query = torch.div(index, h.num_classes, rounding_mode="floor")
    p = bbox_preds[query]
    rot = torch.atan2(p[:, 6:7], p[:, 7:8])
    boxes = torch.cat([p[:, 0:1], p[:, 1:2], p[:, 4:5], p[:, 2:3].exp(), p[:, 3:4].exp(), p[:, 5:6].exp(), rot,
                       p[:, 8:9], p[:, 9:10]], dim=-1)
    keep = torch.ones(len(scores), dtype=torch.bool)
    if h.score_threshold is not None:
        keep &= scores > h.score_threshold
    if h.post_center_range is not None:
        r = torch.tensor(h.post_center_range, dtype=boxes.dtype)
        keep &= (boxes[:, :3] >= r[:3]).all(1) & (boxes[:, :3] <= r[3:]).all(1)
    boxes = boxes[keep].clone()
    boxes[:, 2] = boxes[:, 2] - boxes[:, 5] * 0.5  # gravity centre -> bottom centre
    return {"det.boxes_3d": boxes, "det.scores_3d": scores[keep], "det.labels_3d": labels[keep],
            "det.query_index": query[keep]}
