"""Image backbone (mmdet ResNet with Bottleneck blocks, optional DCNv2) and neck (mmdet FPN).

Module and parameter names follow upstream's state_dict keys (spec section 6), so an official
checkpoint loads with load_state_dict. BatchNorm runs in eval mode on its running statistics.
"""

from __future__ import annotations

from typing import List

import torch
import torch.nn.functional as F
from torch import nn

from .config import BackboneCfg, NeckCfg


def deform_conv2d(x: torch.Tensor, offset: torch.Tensor, mask: torch.Tensor, weight: torch.Tensor,
                  stride: int, padding: int, dilation: int, deform_groups: int) -> torch.Tensor:
    """Modulated deformable convolution (DCNv2), no bias, groups=1 (spec 2.2).

    offset: (N, 2*G*kh*kw, Ho, Wo) with channel 2k = dy, 2k+1 = dx of tap k = i*kw + j (per
    deform group g, at g*2*kh*kw); mask: (N, G*kh*kw, Ho, Wo), already through the sigmoid.
    Each tap samples x bilinearly at (ho*s - p + i*d + dy, wo*s - p + j*d + dx); a sample is 0
    unless -1 < y < H and -1 < x < W, and only in-range corners contribute. The samples, times
    the mask, form im2col columns that one matmul with the weight reduces.
    """
    # The views below assume the default (NCHW) layout; a channels-last model (the bf16 timing)
    # hands over channels-last tensors. A no-op for default-layout ones.
    x, offset, mask = x.contiguous(), offset.contiguous(), mask.contiguous()
    n, c, h, w = x.shape
    o, _, kh, kw = weight.shape
    g = deform_groups
    k = kh * kw
    ho, wo = offset.shape[-2:]
    dev = x.device
    taps_y = (torch.arange(kh, device=dev) * dilation).repeat_interleave(kw).view(1, 1, k, 1, 1)
    taps_x = (torch.arange(kw, device=dev) * dilation).repeat(kh).view(1, 1, k, 1, 1)
    grid_y = (torch.arange(ho, device=dev) * stride - padding).view(1, 1, 1, ho, 1)
    grid_x = (torch.arange(wo, device=dev) * stride - padding).view(1, 1, 1, 1, wo)
    off = offset.view(n, g, k, 2, ho, wo)
    py = (grid_y + taps_y).to(x.dtype) + off[:, :, :, 0]  # (N, G, K, Ho, Wo)
    px = (grid_x + taps_x).to(x.dtype) + off[:, :, :, 1]
    m = mask.view(n, g, k, ho, wo)
    inside = (py > -1) & (py < h) & (px > -1) & (px < w)
    y0 = torch.floor(py)
    x0 = torch.floor(px)
    ly, lx = py - y0, px - x0
    hy, hx = 1 - ly, 1 - lx
    y0 = y0.long()
    x0 = x0.long()
    xg = x.reshape(n, g, c // g, h * w)
    cols = None
    for dy, dx, wt in ((0, 0, hy * hx), (0, 1, hy * lx), (1, 0, ly * hx), (1, 1, ly * lx)):
        yc, xc = y0 + dy, x0 + dx
        ok = inside & (yc >= 0) & (yc < h) & (xc >= 0) & (xc < w)
        idx = (yc.clamp(0, h - 1) * w + xc.clamp(0, w - 1)).view(n, g, 1, k * ho * wo)
        v = torch.gather(xg, 3, idx.expand(n, g, c // g, k * ho * wo))
        v = v * (wt * ok).view(n, g, 1, k * ho * wo)
        cols = v if cols is None else cols + v
    cols = cols * m.view(n, g, 1, k * ho * wo)
    cols = cols.view(n, c, k, ho * wo).reshape(n, c * k, ho * wo)
    out = torch.matmul(weight.reshape(o, c * k), cols)
    return out.view(n, o, ho, wo)


class ModulatedDeformConv2dPack(nn.Module):
    """mmcv DCNv2 with its own offset/mask conv (keys conv2.weight, conv2.conv_offset.*)."""

    def __init__(self, cin, cout, stride, deform_groups):
        super().__init__()
        self.stride, self.padding, self.dilation, self.deform_groups = stride, 1, 1, deform_groups
        self.weight = nn.Parameter(torch.empty(cout, cin, 3, 3))
        self.conv_offset = nn.Conv2d(cin, deform_groups * 3 * 9, 3, stride, 1, bias=True)

    def forward(self, x):
        out = self.conv_offset(x)
        g9 = self.deform_groups * 9
        # chunk(3) + cat of the first two leaves the (dy, dx) interleave as it is.
        offset, mask = out[:, : 2 * g9], torch.sigmoid(out[:, 2 * g9:])
        return deform_conv2d(x, offset, mask, self.weight, self.stride, self.padding, self.dilation,
                             self.deform_groups)


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes, planes, stride, style, dcn, deform_groups, downsample, eps):
        super().__init__()
        s1, s2 = (stride, 1) if style == "caffe" else (1, stride)
        self.conv1 = nn.Conv2d(inplanes, planes, 1, s1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes, eps=eps)
        if dcn:
            self.conv2 = ModulatedDeformConv2dPack(planes, planes, s2, deform_groups)
        else:
            self.conv2 = nn.Conv2d(planes, planes, 3, s2, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes, eps=eps)
        self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * 4, eps=eps)
        self.downsample = None
        if downsample:
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, planes * 4, 1, stride, bias=False),
                                            nn.BatchNorm2d(planes * 4, eps=eps))

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = F.relu(self.bn1(self.conv1(x)))
        out = F.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return F.relu(out + identity)


class ResNet(nn.Module):
    def __init__(self, cfg: BackboneCfg):
        super().__init__()
        if cfg.in_channels != 3:
            raise ValueError("img_backbone.in_channels must be 3")
        self.out_indices = list(cfg.out_indices)
        eps = cfg.norm_eps
        self.conv1 = nn.Conv2d(3, cfg.stem_channels, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(cfg.stem_channels, eps=eps)
        self.res_layers = []
        inplanes = cfg.stem_channels
        for i, nblocks in enumerate(cfg.stage_blocks()):
            planes = cfg.planes(i)
            dcn = cfg.dcn and cfg.stage_with_dcn[i]
            blocks = []
            for b in range(nblocks):
                blocks.append(Bottleneck(inplanes, planes, cfg.strides[i] if b == 0 else 1, cfg.style, dcn,
                                         cfg.dcn_deform_groups, b == 0, eps))
                inplanes = planes * 4
            name = f"layer{i + 1}"
            self.add_module(name, nn.Sequential(*blocks))
            self.res_layers.append(name)

    def forward(self, x) -> List[torch.Tensor]:
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 3, 2, 1)
        outs = []
        last = max(self.out_indices)
        for i, name in enumerate(self.res_layers[: last + 1]):
            x = getattr(self, name)(x)
            if i in self.out_indices:
                outs.append(x)
        return outs


class ConvModule(nn.Module):
    """mmcv ConvModule without norm or activation: the key is <name>.conv.*"""

    def __init__(self, cin, cout, k, stride=1):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, k, stride, k // 2, bias=True)

    def forward(self, x):
        return self.conv(x)


class FPN(nn.Module):
    def __init__(self, cfg: NeckCfg):
        super().__init__()
        self.cfg = cfg
        end = cfg.backbone_end_level()
        self.used = end - cfg.start_level
        self.lateral_convs = nn.ModuleList(
            [ConvModule(cfg.in_channels[i], cfg.out_channels, 1) for i in range(cfg.start_level, end)])
        fpn = [ConvModule(cfg.out_channels, cfg.out_channels, 3) for _ in range(self.used)]
        extra = cfg.num_outs - self.used
        if cfg.add_extra_convs != "off":
            for i in range(extra):
                cin = cfg.in_channels[end - 1] if (i == 0 and cfg.add_extra_convs == "on_input") else cfg.out_channels
                fpn.append(ConvModule(cin, cfg.out_channels, 3, 2))
        self.fpn_convs = nn.ModuleList(fpn)

    def forward(self, inputs: List[torch.Tensor]) -> List[torch.Tensor]:
        c = self.cfg
        lat = [conv(inputs[i + c.start_level]) for i, conv in enumerate(self.lateral_convs)]
        for i in range(self.used - 1, 0, -1):
            lat[i - 1] = lat[i - 1] + F.interpolate(lat[i], size=lat[i - 1].shape[2:], mode="nearest")
        outs = [self.fpn_convs[i](lat[i]) for i in range(self.used)]
        if c.num_outs > self.used:
            if c.add_extra_convs == "off":
                for _ in range(c.num_outs - self.used):
                    outs.append(F.max_pool2d(outs[-1], 1, stride=2))
            else:
                src = {"on_input": inputs[c.backbone_end_level() - 1], "on_lateral": lat[-1],
                       "on_output": outs[-1]}[c.add_extra_convs]
                outs.append(self.fpn_convs[self.used](src))
                for i in range(self.used + 1, c.num_outs):
                    # ReLU only before the 2nd and later extra convs.
                    src = F.relu(outs[-1]) if c.relu_before_extra_convs else outs[-1]
                    outs.append(self.fpn_convs[i](src))
        return outs
