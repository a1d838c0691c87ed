// mmdet ResNet with Bottleneck blocks (spec §2.2): stem conv7x7/2 + BN + ReLU + maxpool 3x3/2,
// then stages of bottlenecks; eval-mode BN folded into each conv; DCNv2
// (ModulatedDeformConv2dPack) as conv2 in the stages that have it. NHWC activations.
#pragma once

#include <vector>

#include "backend/ops.h"
#include "model/config.h"
#include "model/weights.h"

namespace bev {

// img_backbone.layer{s}.{b}
struct BottleneckWeights {
  PreparedWeights conv1;        // .conv1 + .bn1 (1x1; caffe style carries the stride), ReLU
  PreparedWeights conv2;        // .conv2 + .bn2 (3x3; pytorch style carries the stride), ReLU
  PreparedWeights conv2_offset; // .conv2.conv_offset (DCN stages only: 27 channels, with bias)
  PreparedWeights conv3;        // .conv3 + .bn3 (1x1), + identity, ReLU
  PreparedWeights downsample;   // .downsample.0 + .downsample.1 (block 0 only)
  PreparedWeights fused;        // the block as one op (stride-1 blocks without DCN), else empty
  bool dcn = false;
  bool has_downsample = false;
  // The dtype of conv1's and conv2's outputs: bf16 in bf16 precision, u8 codes in int8 precision
  // (conv1 and conv2 then write the next conv's int8 input), else f32.
  DType inner = DType::kF32;
  // The block output's dtype: f32 where the neck reads it, else bf16 in bf16 precision and u8
  // codes of the next block's input step in int8 precision; and the downsample's (s8 codes when
  // the output is u8).
  DType out = DType::kF32;
  DType identity = DType::kF32;
};

// img_backbone
struct ResNetWeights {
  PreparedWeights stem;                              // .conv1 + .bn1, ReLU
  DType stem_out = DType::kF32;                      // bf16 in bf16 precision, u8 (layer1's input codes) in int8
  std::vector<std::vector<BottleneckWeights>> stages;  // .layer1 ... .layer4
};

ResNetWeights load_resnet(Ops& ops, const WeightSource& w, const BackboneConfig& cfg);

// x: f32 [N, H, W, 3] (NHWC) -> the outputs of cfg.out_indices stages, NHWC.
std::vector<Tensor> resnet_forward(Ops& ops, const ResNetWeights& w, const BackboneConfig& cfg, const Tensor& x);

}  // namespace bev
