// An int8 2-D convolution on oneDNN (`--precision int8`): u8 activations (an input after a ReLU)
// or s8, s8 weights quantized symmetrically per output channel, integer products accumulated
// exactly in s32, then one f32 scale per output channel, the f32 bias, the residual and the ReLU:
// y = act_scale * w_scale[o] * sum(q_x * q_w) + b[o] (+ r). With attrs.int8_out_step the output
// is int8 codes instead, u8 after a ReLU and s8 without: saturate(nearbyint(y / out_step)), the
// next conv's input, so a chain of convs never leaves int8. With attrs.int8_residual_step the
// residual r is int8 codes too (r = step * code): a ResNet block's u8 input, or its downsample's
// s8 output, summed in place where the output is int8 (the block's output over its identity).
// The floats it reads (an input to quantize, a residual) and writes (a float output) are f32 or
// bf16, as the tensors given are: bf16 where the backend's float arithmetic is (int8 on AMX).
// VNNI (and AMX-int8) multiply u8 by s8 exactly; without them oneDNN 2.x emulates with saturating
// or halved products, so the class refuses machines without an exact int8 dot product.
//
// In the model it runs inside cpu::Conv2d when the backend's precision is int8 and the conv was
// prepared with a calibrated input step (Conv2dAttrs::int8_step); tests/test_op_conv2d_int8.cpp
// checks it against an integer reference, bench_conv's int8 rows time it.
#pragma once

#include <memory>
#include <string>

#include "backend/cpu/onednn.h"  // has_int8_dot, require_precision
#include "backend/op.h"
#include "core/tensor.h"

namespace bev::cpu {

class Conv2dInt8 {
 public:
  // Symmetric per output channel: scale[o] = max|w[o]| / 127 (1 for an all-zero channel) and
  // q = clamp(nearbyint(w / scale[o]), -127, 127). Returns the s8 OIHW weights; *scales is f32 [O].
  static Tensor quantize_weights(const Tensor& weight_oihw, Tensor* scales);

  // `act`: DType::kU8 (an input after a ReLU: negative values quantize to 0) or kI8; `act_scale`:
  // the f32 value of one integer step of the input. Throws kUnsupported without has_int8_dot().
  Conv2dInt8(const Tensor& weight_oihw, const Tensor* bias, const Conv2dAttrs& attrs, DType act, float act_scale);
  ~Conv2dInt8();
  Conv2dInt8(Conv2dInt8&&) noexcept;
  Conv2dInt8& operator=(Conv2dInt8&&) noexcept;

  // The same quantized weights, scales and bias under other attributes (same kernel and groups),
  // as Conv2d::with_attrs: the fused bottleneck's 3x3 on strips of rows.
  Conv2dInt8 with_attrs(const Conv2dAttrs& attrs) const;

  Shape output_shape(const Shape& input_nhwc) const;
  // x: NHWC, contiguous host f32 or bf16 (quantized here, into the thread's conversion scratch)
  // or already of act(); y: NHWC, out(), f32 or bf16 where out() is kF32; residual as in
  // Conv2d::run: f32 or bf16, or int8 codes with attrs.int8_residual_step (dequantized into a
  // float y first, so rounded to bf16 there under a bf16 y); in place (it is y) when its elements
  // are y's size.
  // `lane` as in Conv2d::run: concurrent callers on different lanes never share a plan.
  void run(const Tensor& x_nhwc, const Tensor* residual_nhwc, Tensor& y_nhwc, int lane = 0) const;
  // q = saturate(nearbyint(x / act_scale)) in act(), what run() does to an f32 input.
  void quantize(const Tensor& x_f32, Tensor& q) const;

  double flops(const Shape& input_nhwc) const;
  std::string impl_name(const Shape& input_nhwc) const;  // oneDNN's kernel, e.g. "brg:avx512_core_vnni"
  DType act() const;
  float act_scale() const;
  DType out() const;  // with attrs.int8_out_step kU8 after a ReLU, kI8 without; else kF32
  const Tensor& weight_scales() const;  // f32 [O]

 private:
  struct State;
  explicit Conv2dInt8(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace bev::cpu
