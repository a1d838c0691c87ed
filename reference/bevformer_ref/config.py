"""Model configuration: the three official presets (spec section 1) and upstream-style JSON
configs (a golden set's config.json: the mmdet3d `model` dict plus its `effective` section).

Absent keys take the defaults of the upstream class signatures, as mmcv's builders would. Field
names follow the upstream keys; the comment on each names its path under `model`.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from dataclasses import dataclass, field
from typing import List, Optional, Sequence

NUSCENES_CLASSES = [
    "car", "truck", "construction_vehicle", "bus", "trailer",
    "barrier", "motorcycle", "bicycle", "pedestrian", "traffic_cone",
]

POST_NORM = ["self_attn", "norm", "cross_attn", "norm", "ffn", "norm"]


class ConfigError(ValueError):
    pass


@dataclass
class BackboneCfg:  # model.img_backbone (mmdet ResNet, Bottleneck blocks)
    depth: int = 50
    in_channels: int = 3
    stem_channels: int = 64
    base_channels: int = 64
    num_stages: int = 4
    strides: List[int] = field(default_factory=lambda: [1, 2, 2, 2])
    out_indices: List[int] = field(default_factory=lambda: [3])
    style: str = "pytorch"  # 'pytorch': stride on the 3x3; 'caffe': stride on the first 1x1
    norm_eps: float = 1e-5
    dcn: bool = False  # DCNv2 (mmcv ModulatedDeformConv2dPack) as conv2
    dcn_deform_groups: int = 1
    stage_with_dcn: List[bool] = field(default_factory=lambda: [False, False, False, False])

    def stage_blocks(self) -> List[int]:
        arch = {50: [3, 4, 6, 3], 101: [3, 4, 23, 3], 152: [3, 8, 36, 3]}
        if self.depth not in arch:
            raise ConfigError(f"img_backbone.depth {self.depth}: only Bottleneck ResNets (50, 101, 152)")
        return arch[self.depth][: self.num_stages]

    def planes(self, stage: int) -> int:
        return self.base_channels * 2 ** stage

    def out_channels(self, stage: int) -> int:
        return self.planes(stage) * 4


@dataclass
class NeckCfg:  # model.img_neck (mmdet FPN)
    in_channels: List[int] = field(default_factory=lambda: [2048])
    out_channels: int = 256
    num_outs: int = 1
    start_level: int = 0
    end_level: int = -1
    add_extra_convs: str = "off"  # 'off' | 'on_input' | 'on_lateral' | 'on_output'
    relu_before_extra_convs: bool = False

    def backbone_end_level(self) -> int:
        return len(self.in_channels) if self.end_level == -1 else self.end_level


@dataclass
class ImageCfg:  # img_norm_cfg + test_pipeline (outside `model` upstream)
    mean: List[float] = field(default_factory=lambda: [123.675, 116.28, 103.53])
    std: List[float] = field(default_factory=lambda: [58.395, 57.12, 57.375])
    to_rgb: bool = True
    resize_scale: float = 1.0
    size_divisor: int = 32
    width: int = 1600  # camera image as delivered, before resize
    height: int = 900

    def resized_wh(self):
        return int(self.width * self.resize_scale), int(self.height * self.resize_scale)

    def padded_wh(self):
        w, h = self.resized_wh()
        d = max(self.size_divisor, 1)
        return (w + d - 1) // d * d, (h + d - 1) // d * d


@dataclass
class AttnCfg:
    num_heads: int = 8
    num_levels: int = 4
    num_points: int = 4


@dataclass
class TransformerCfg:  # model.pts_bbox_head.transformer (PerceptionTransformer)
    embed_dims: int = 256
    num_feature_levels: int = 4
    num_cams: int = 6
    rotate_prev_bev: bool = True
    use_shift: bool = True
    use_can_bus: bool = True
    can_bus_norm: bool = True
    use_cams_embeds: bool = True
    rotate_center: List[float] = field(default_factory=lambda: [100.0, 100.0])
    # Not an upstream key: True = the original release's `shift_ref_2d = ref_2d` alias, which
    # shifts both TSA queue branches (spec 2.7); False = HEAD's clone.
    shift_ref_2d_alias: bool = False
    encoder_layers: int = 6
    num_points_in_pillar: int = 4
    pc_range: List[float] = field(default_factory=lambda: [-51.2, -51.2, -5.0, 51.2, 51.2, 3.0])
    tsa: AttnCfg = field(default_factory=lambda: AttnCfg(8, 1, 4))
    tsa_num_bev_queue: int = 2
    sca: AttnCfg = field(default_factory=lambda: AttnCfg(8, 4, 8))
    encoder_ffn_dims: int = 512
    decoder_layers: int = 6
    decoder_self_attn_heads: int = 8
    decoder_cross: AttnCfg = field(default_factory=lambda: AttnCfg(8, 1, 4))
    decoder_ffn_dims: int = 512


@dataclass
class HeadCfg:  # model.pts_bbox_head (BEVFormerHead) + bbox_coder (NMSFreeCoder)
    bev_h: int = 30
    bev_w: int = 30
    num_query: int = 100
    num_classes: int = 10
    code_size: int = 10
    num_reg_fcs: int = 2
    with_box_refine: bool = False
    code_weights: List[float] = field(default_factory=lambda: [1.0] * 8 + [0.2, 0.2])
    pos_num_feats: int = 128
    pos_row_num_embed: int = 50
    pos_col_num_embed: int = 50
    pc_range: List[float] = field(default_factory=lambda: [-51.2, -51.2, -5.0, 51.2, 51.2, 3.0])
    post_center_range: Optional[List[float]] = None
    max_num: int = 100
    score_threshold: Optional[float] = None


@dataclass
class ModelCfg:
    name: str = ""
    backbone: BackboneCfg = field(default_factory=BackboneCfg)
    neck: NeckCfg = field(default_factory=NeckCfg)
    image: ImageCfg = field(default_factory=ImageCfg)
    transformer: TransformerCfg = field(default_factory=TransformerCfg)
    head: HeadCfg = field(default_factory=HeadCfg)
    class_names: List[str] = field(default_factory=lambda: list(NUSCENES_CLASSES))
    video_test_mode: bool = False

    def to_dict(self):
        return dataclasses.asdict(self)

    def validate(self):
        b, n, t, h = self.backbone, self.neck, self.transformer, self.head
        b.stage_blocks()
        if b.style not in ("pytorch", "caffe"):
            raise ConfigError(f"img_backbone.style '{b.style}'")
        want = [b.out_channels(o) for o in b.out_indices]
        if n.in_channels != want:
            raise ConfigError(f"img_neck.in_channels {n.in_channels} != backbone outputs {want}")
        if n.out_channels != t.embed_dims:
            raise ConfigError("img_neck.out_channels must equal transformer embed_dims")
        if t.sca.num_levels != n.num_outs or n.num_outs > t.num_feature_levels:
            raise ConfigError("SCA num_levels must equal img_neck.num_outs (<= num_feature_levels)")
        if t.tsa.num_levels != 1 or t.decoder_cross.num_levels != 1 or t.tsa_num_bev_queue != 2:
            raise ConfigError("TSA and decoder cross-attention attend one BEV level; TSA queue is 2")
        if t.sca.num_points % t.num_points_in_pillar:
            raise ConfigError("SCA num_points must be a multiple of num_points_in_pillar")
        if h.code_size != 10 or h.num_reg_fcs != 2:
            raise ConfigError("code_size 10 and num_reg_fcs 2 only")
        if 2 * h.pos_num_feats != t.embed_dims:
            raise ConfigError("positional_encoding.num_feats must be embed_dims / 2")
        if len(self.class_names) != h.num_classes:
            raise ConfigError("one class name per class")
        for a in (t.tsa, t.sca, t.decoder_cross):
            if t.embed_dims % a.num_heads:
                raise ConfigError("num_heads must divide embed_dims")
        return self


# ---------------------------------------------------------------------------------------------
# Presets (spec section 1)

def _preset_common() -> ModelCfg:
    c = ModelCfg()
    c.neck = NeckCfg([2048], 256, 1, 0, -1, "on_output", True)
    c.image = ImageCfg(size_divisor=32, width=1600, height=900)
    t = c.transformer
    t.encoder_layers, t.decoder_layers = 3, 6
    t.tsa, t.sca, t.decoder_cross = AttnCfg(8, 1, 4), AttnCfg(8, 1, 8), AttnCfg(8, 1, 4)
    h = c.head
    h.num_query, h.with_box_refine, h.max_num = 900, True, 300
    h.post_center_range = [-61.2, -61.2, -10.0, 61.2, 61.2, 10.0]
    c.video_test_mode = True
    return c


def preset(name: str) -> ModelCfg:
    if name not in ("tiny", "small", "base"):
        raise ConfigError(f"no preset named '{name}' (tiny, small, base)")
    c = _preset_common()
    c.name = name
    caffe = name in ("small", "base")
    if caffe:
        c.backbone.depth, c.backbone.style = 101, "caffe"
        c.backbone.dcn, c.backbone.stage_with_dcn = True, [False, False, True, True]
        c.image.mean, c.image.std, c.image.to_rgb = [103.530, 116.280, 123.675], [1.0, 1.0, 1.0], False
    bev = {"tiny": 50, "small": 150, "base": 200}[name]
    c.head.bev_h = c.head.bev_w = c.head.pos_row_num_embed = c.head.pos_col_num_embed = bev
    if name == "tiny":
        c.image.resize_scale = 0.5
    elif name == "small":
        c.image.resize_scale = 0.8
    else:
        c.backbone.out_indices = [1, 2, 3]
        c.neck.in_channels, c.neck.num_outs = [512, 1024, 2048], 4
        c.transformer.sca.num_levels = 4
        c.transformer.encoder_layers = 6
    return c.validate()


# ---------------------------------------------------------------------------------------------
# Upstream-style JSON

def _get(d: dict, key: str, default=None):
    v = d.get(key)
    return default if v is None else v


def _attn(d: dict, default: AttnCfg, dims: int, where: str) -> AttnCfg:
    if _get(d, "embed_dims", 256) != dims:
        raise ConfigError(f"{where}.embed_dims is {_get(d, 'embed_dims', 256)} (256 when absent), model is {dims}")
    return AttnCfg(_get(d, "num_heads", default.num_heads), _get(d, "num_levels", default.num_levels),
                   _get(d, "num_points", default.num_points))


def _layer_ffn(d: dict, dims: int, where: str) -> int:
    """feedforward_channels of a BaseTransformerLayer (the layer's deprecated argument wins)."""
    ch = None
    if d.get("ffn_cfgs") is not None:
        f = d["ffn_cfgs"]
        if _get(f, "embed_dims", dims) != dims:
            raise ConfigError(f"{where}.ffn_cfgs.embed_dims differs from the model's {dims}")
        ch = f.get("feedforward_channels")
    elif dims != 256:
        raise ConfigError(f"{where}.ffn_cfgs absent: upstream builds the FFN for 256 channels")
    else:
        ch = 1024
    if d.get("feedforward_channels") is not None:
        ch = d["feedforward_channels"]
    if ch is None:
        raise ConfigError(f"{where}.feedforward_channels missing")
    if _get(d, "ffn_num_fcs", 2) != 2:
        raise ConfigError(f"{where}.ffn_num_fcs must be 2")
    if list(d.get("operation_order", [])) != POST_NORM:
        raise ConfigError(f"{where}.operation_order must be the post-norm order {POST_NORM}")
    return int(ch)


def from_json(j: dict, name: str = "config.json") -> ModelCfg:
    model = j["model"] if "model" in j else j
    top = j if "model" in j else {}
    eff = top.get("effective") or {}
    c = ModelCfg(name=name)
    c.video_test_mode = bool(_get(model, "video_test_mode", False))
    pc_fallback = top.get("point_cloud_range") or eff.get("point_cloud_range")

    bb = model["img_backbone"]
    b = c.backbone
    b.depth = bb["depth"]
    b.in_channels = _get(bb, "in_channels", 3)
    b.base_channels = _get(bb, "base_channels", 64)
    b.stem_channels = _get(bb, "stem_channels", b.base_channels)
    b.num_stages = _get(bb, "num_stages", 4)
    b.strides = list(_get(bb, "strides", [1, 2, 2, 2]))
    b.out_indices = list(_get(bb, "out_indices", [0, 1, 2, 3]))
    b.style = _get(bb, "style", "pytorch")
    if any(x != 1 for x in _get(bb, "dilations", [1])) or _get(bb, "deep_stem", False) or _get(bb, "avg_down", False):
        raise ConfigError("img_backbone: dilations / deep_stem / avg_down are not supported")
    b.norm_eps = _get(_get(bb, "norm_cfg", {}), "eps", 1e-5)
    if bb.get("dcn") is not None:
        if bb["dcn"].get("type") != "DCNv2" or _get(bb["dcn"], "fallback_on_stride", False):
            raise ConfigError("img_backbone.dcn: only DCNv2 with fallback_on_stride=False")
        b.dcn = True
        b.dcn_deform_groups = _get(bb["dcn"], "deform_groups", 1)
    b.stage_with_dcn = list(_get(bb, "stage_with_dcn", [False] * 4))

    nk = model["img_neck"]
    n = c.neck
    n.in_channels = list(nk["in_channels"])
    n.out_channels = nk["out_channels"]
    n.num_outs = nk["num_outs"]
    n.start_level = _get(nk, "start_level", 0)
    n.end_level = _get(nk, "end_level", -1)
    ex = nk.get("add_extra_convs", False)
    if isinstance(ex, bool) or ex is None:
        n.add_extra_convs = ("on_input" if _get(nk, "extra_convs_on_inputs", True) else "on_output") if ex else "off"
    else:
        n.add_extra_convs = ex
    n.relu_before_extra_convs = bool(_get(nk, "relu_before_extra_convs", False))

    hd = model["pts_bbox_head"]
    h = c.head
    h.bev_h, h.bev_w = _get(hd, "bev_h", 30), _get(hd, "bev_w", 30)
    h.num_query = _get(hd, "num_query", 100)
    h.num_classes = hd["num_classes"]
    h.code_size = _get(hd, "code_size", 10)
    h.num_reg_fcs = _get(hd, "num_reg_fcs", 2)
    h.with_box_refine = bool(_get(hd, "with_box_refine", False))
    if _get(hd, "as_two_stage", False):
        raise ConfigError("pts_bbox_head.as_two_stage is not supported")
    if hd.get("code_weights") is not None:
        h.code_weights = list(hd["code_weights"])
    pe = hd["positional_encoding"]
    if pe.get("type") != "LearnedPositionalEncoding":
        raise ConfigError("positional_encoding must be LearnedPositionalEncoding")
    h.pos_num_feats = pe["num_feats"]
    h.pos_row_num_embed = _get(pe, "row_num_embed", 50)
    h.pos_col_num_embed = _get(pe, "col_num_embed", 50)
    coder = hd["bbox_coder"]
    h.pc_range = list(_get(coder, "pc_range", pc_fallback))
    h.post_center_range = coder.get("post_center_range")
    h.max_num = _get(coder, "max_num", 100)
    h.score_threshold = coder.get("score_threshold")

    tr = hd["transformer"]
    t = c.transformer
    t.embed_dims = _get(tr, "embed_dims", 256)
    t.num_feature_levels = _get(tr, "num_feature_levels", 4)
    t.num_cams = _get(tr, "num_cams", 6)
    for k in ("rotate_prev_bev", "use_shift", "use_can_bus", "can_bus_norm", "use_cams_embeds"):
        setattr(t, k, bool(_get(tr, k, True)))
    t.rotate_center = list(_get(tr, "rotate_center", [100, 100]))
    enc = tr["encoder"]
    t.encoder_layers = enc["num_layers"]
    t.pc_range = list(_get(enc, "pc_range", pc_fallback))
    t.num_points_in_pillar = _get(enc, "num_points_in_pillar", 4)
    el = enc["transformerlayers"]
    t.encoder_ffn_dims = _layer_ffn(el, t.embed_dims, "encoder.transformerlayers")
    tsa_d, sca_d = el["attn_cfgs"]
    t.tsa = _attn(tsa_d, AttnCfg(8, 4, 4), t.embed_dims, "TemporalSelfAttention")
    t.tsa_num_bev_queue = _get(tsa_d, "num_bev_queue", 2)
    _attn(sca_d, AttnCfg(), t.embed_dims, "SpatialCrossAttention")
    msda = sca_d.get("deformable_attention") or {"embed_dims": 256, "num_levels": 4}
    t.sca = _attn(msda, AttnCfg(8, 4, 8), t.embed_dims, "MSDeformableAttention3D")
    dec = tr["decoder"]
    t.decoder_layers = dec["num_layers"]
    dl = dec["transformerlayers"]
    t.decoder_ffn_dims = _layer_ffn(dl, t.embed_dims, "decoder.transformerlayers")
    mha_d, cross_d = dl["attn_cfgs"]
    if mha_d["embed_dims"] != t.embed_dims:
        raise ConfigError("decoder MultiheadAttention embed_dims differs from the model's")
    t.decoder_self_attn_heads = mha_d["num_heads"]
    t.decoder_cross = _attn(cross_d, AttnCfg(8, 4, 4), t.embed_dims, "CustomMSDeformableAttention")
    t.shift_ref_2d_alias = bool(top.get("shift_ref_2d_alias", eff.get("shift_ref_2d_alias", False)))

    img = c.image
    norm = top.get("img_norm_cfg") or eff.get("img_norm_cfg")
    if norm:
        img.mean, img.std, img.to_rgb = list(norm["mean"]), list(norm["std"]), bool(_get(norm, "to_rgb", True))
    elif b.style == "caffe":
        img.mean, img.std, img.to_rgb = [103.530, 116.280, 123.675], [1.0, 1.0, 1.0], False
    img.resize_scale = float(eff.get("resize_scale", 1.0))
    img.size_divisor = int(eff.get("size_divisor", 32))
    if eff.get("image_size_raw_wh"):
        img.width, img.height = eff["image_size_raw_wh"]
    c.class_names = list(top.get("class_names") or eff.get("class_names") or
                         (NUSCENES_CLASSES if h.num_classes == 10 else [f"class_{i}" for i in range(h.num_classes)]))
    c.validate()
    _check_effective(c, eff)
    return c


def _check_effective(c: ModelCfg, eff: dict):
    """The effective section restates values; each one present must agree with the model dict."""
    t, h = c.transformer, c.head
    ours = {
        "bev_h": h.bev_h, "bev_w": h.bev_w, "embed_dims": t.embed_dims, "num_cams": t.num_cams,
        "encoder_layers": t.encoder_layers, "decoder_layers": t.decoder_layers,
        "num_points_in_pillar": t.num_points_in_pillar, "tsa_num_points": t.tsa.num_points,
        "tsa_num_levels": t.tsa.num_levels, "sca_num_points": t.sca.num_points,
        "sca_num_levels": t.sca.num_levels, "decoder_msda_num_points": t.decoder_cross.num_points,
        "decoder_msda_num_levels": t.decoder_cross.num_levels, "num_query": h.num_query,
        "num_classes": h.num_classes, "max_num": h.max_num, "rotate_center": t.rotate_center,
        "num_feature_levels_fpn": c.neck.num_outs, "num_feature_levels_transformer_param": t.num_feature_levels,
        "image_size_padded_wh": list(c.image.padded_wh()), "with_box_refine": h.with_box_refine,
        "video_test_mode": c.video_test_mode, "point_cloud_range": t.pc_range,
    }
    for k, v in ours.items():
        if k in eff and eff[k] is not None and _norm(eff[k]) != _norm(v):
            raise ConfigError(f"effective.{k} is {eff[k]} but the model dict gives {v}")


def _norm(v):
    if isinstance(v, (list, tuple)):
        return [_norm(x) for x in v]
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return v


def load_config(preset_or_path: str) -> ModelCfg:
    if preset_or_path in ("tiny", "small", "base"):
        return preset(preset_or_path)
    with open(preset_or_path) as f:
        return from_json(json.load(f), preset_or_path)
