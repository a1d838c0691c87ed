// A 1x1, stride-1 convolution in bf16 on AMX tiles, with its epilogue fused:
//   y[p] = relu?(W x[p] + b + residual[p])
// over the pixels of an NHWC map: a GEMM [P, K] x [K, O] whose rows are the map's pixels.
//
// What it is for: the fused bottleneck's strips (cpu::Bottleneck) in bf16 on AMX. Run conv by
// conv, layer1's convs stream their maps through memory and oneDNN's kernels do not overlap that
// with their arithmetic (the profile's bounds: tiny layer1 57 ms against 42). Fused in strips with
// oneDNN's kernels, a burst of prefetches for the next strip stalled the core instead. Here the
// caller hands the next strip's rows to conv3's run (`spread`), which asks for a few lines per
// column block while its tiles compute. Over whole maps oneDNN streams better, so cpu::Conv2d::run
// keeps oneDNN and only the bottleneck calls this (Conv2d::amx1x1).
//
// A block is 32 pixels by 32 output channels in four accumulator tiles that start from the bias; a
// bf16 residual is added by the tile unit as well (its channels times an identity), so that the
// epilogue of conv3, whose 64 input channels give the tiles little work per output, is only the
// ReLU and the rounding.
//
// The arithmetic of a pixel does not depend on which pixels a call covers (the tile products and
// the order over K are fixed), so strips of a map give the bits of the whole map. A call's last,
// partial block is computed over the 32 pixels that end it, and only its new rows are written
// (the rows before it may be y == residual, already overwritten); a call of fewer than 32 pixels
// is copied into zero-padded blocks instead.
//
// Rounding: x and the weights are bf16, products and sums f32 (the tile unit's), the bias first,
// then the products in order of K, then the residual, ReLU, one rounding to y's dtype
// (vcvtne2ps2bf16: to nearest even). The tile unit reads subnormal bf16 inputs as zero and flushes
// subnormal sums. NaN propagates through ReLU (relu(NaN) is NaN, as in PyTorch); a non-finite bf16
// residual channel makes NaN the pixel's other 31 channels of its column block (block() in
// amx1x1.cpp).
#pragma once

#include <cstdint>
#include <vector>

#include "backend/op.h"
#include "core/tensor.h"

namespace bev::cpu {

class Amx1x1 {
 public:
  // Whether a conv runs here: 1x1, stride 1, no padding, dilation 1, groups 1, bf16 arithmetic,
  // input channels a multiple of 32 (a tile row of bf16), output channels a multiple of 32 (two
  // column tiles), at most kMaxWeights weights, and AMX present, oneDNN not capped below it, and
  // the tile state granted. The input must be bf16.
  static bool supports(const Conv2dAttrs& attrs, int64_t in_channels, int64_t out_channels, int64_t kh, int64_t kw,
                       Precision arithmetic);
  // A block reads every weight once per 32 pixels: they must stay in L2 (2 MiB a core) beside the
  // strips. 512 KiB of bf16: ResNet's 1x1s up to layer3 (1024 x 256).
  static constexpr int64_t kMaxWeights = 256 * 1024;

  // weight_oihw: f32 [O, K, 1, 1] (rounded to bf16 here, to nearest even); bias: f32 [O] or null.
  Amx1x1(const Tensor& weight_oihw, const Tensor* bias, bool relu);

  // x: `pixels` rows of K bf16; residual: null, or `pixels` rows of O in res_dtype (bf16 or f32),
  // which may be y itself (same dtype) but must not overlap it otherwise; y: `pixels` rows of O in
  // y_dtype (bf16 or f32), not overlapping x. On the calling thread: its caller, the fused
  // bottleneck, splits the map among its own lanes. spread: spread_bytes that the caller reads
  // next (the next strip of x), asked for into L2 a few lines per column block while the tiles
  // compute, so that their transfer overlaps this call's arithmetic.
  void run(const uint16_t* x, const void* residual, DType res_dtype, void* y, DType y_dtype, int64_t pixels,
           const void* spread = nullptr, size_t spread_bytes = 0) const;

  int64_t in_channels() const { return k_; }
  int64_t out_channels() const { return o_; }

 private:
  int64_t k_ = 0, o_ = 0;
  bool relu_ = false;
  // [O / 16][K / 32] tiles of 16 rows x 64 bytes: row r holds, for each of the tile's 16 output
  // channels, the weights of input channels 2r and 2r + 1 (the tile unit's pairs).
  std::vector<uint16_t> w_;
  std::vector<float> b_;  // [O], zeros without a bias
};

}  // namespace bev::cpu
