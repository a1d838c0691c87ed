#include "backend/ops.h"

#include <cmath>
#include <utility>

#include "bevformer/error.h"

namespace bev {
namespace {

const char* kOpNames[] = {
#define BEV_OP_NAME(name) #name,
    BEV_OPS(BEV_OP_NAME)
#undef BEV_OP_NAME
};

[[noreturn]] void shape_error(const std::string& op, const std::string& label, const std::string& problem,
                              const std::string& expected) {
  throw Error(ErrorKind::kInvalidInput, problem).where(label.empty() ? op : op + " '" + label + "'").expected(expected);
}

void expect_rank(const char* op, const std::string& label, const char* name, const Tensor& t, int64_t rank) {
  if (!t.defined()) shape_error(op, label, std::string(name) + " is undefined", "a tensor");
  if (t.dim() != rank) {
    shape_error(op, label, std::string(name) + " is " + t.describe(), "rank " + std::to_string(rank));
  }
}

void expect_f32(const char* op, const std::string& label, const char* name, const Tensor& t) {
  if (t.dtype() != DType::kF32) shape_error(op, label, std::string(name) + " is " + t.describe(), "f32");
}

// b has a's rank and every extent of b equals a's or is 1.
void expect_broadcastable(const char* op, const std::string& label, const Tensor& a, const Tensor& b) {
  bool ok = a.dim() == b.dim();
  for (int64_t d = 0; ok && d < a.dim(); ++d) ok = b.size(d) == a.size(d) || b.size(d) == 1;
  if (!ok) shape_error(op, label, "shapes " + a.describe() + " and " + b.describe() + " do not broadcast",
                       "b of a's rank with each extent equal to a's or 1");
}

void expect_same_shape(const char* op, const std::string& label, const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape()) shape_error(op, label, "shapes " + a.describe() + " and " + b.describe() + " differ", "equal shapes");
}

// Prepared state is the preparing backend's private memory: another backend cannot run it.
// For the fused ops that run the model's own linears: whether w is a linear with ReLU, none when
// it is not a linear.
std::optional<bool> linear_relu(const PreparedWeights& w) {
  const auto* a = std::get_if<LinearAttrs>(&w.attrs);
  if (w.kind != OpKind::linear || !a || w.weight_shape.size() != 2) return std::nullopt;
  return a->relu;
}

void expect_prepared_by(const char* op, const std::string& label, const PreparedWeights& w, const Backend& backend) {
  if (w.backend != &backend) {
    shape_error(op, label, w.backend ? std::string("weights prepared by the ") + w.backend->name() + " backend"
                                     : std::string("weights never prepared"),
                std::string("weights prepared by this Ops' backend (") + backend.name() + ")");
  }
}

}  // namespace

bool conv2d_geometry_valid(const Conv2dAttrs& a) {
  return a.stride_h >= 1 && a.stride_w >= 1 && a.dilation_h >= 1 && a.dilation_w >= 1 && a.pad_h >= 0 && a.pad_w >= 0 &&
         a.groups >= 1;
}

namespace {
DType int8_codes(bool is_unsigned) { return is_unsigned ? DType::kU8 : DType::kI8; }
}  // namespace

// A step of 0 is no int8 (Conv2dAttrs); any other is int8, and the backend refuses one that is
// not a normal positive float.
DType conv2d_int8_input(const Conv2dAttrs& a) { return a.int8_step != 0 ? int8_codes(a.int8_unsigned) : DType::kF32; }
DType conv2d_int8_output(const Conv2dAttrs& a) { return a.int8_out_step != 0 ? int8_codes(a.relu) : DType::kF32; }
DType conv2d_int8_residual(const Conv2dAttrs& a) {
  return a.int8_residual_step != 0 ? int8_codes(a.int8_residual_unsigned) : DType::kF32;
}

std::string conv2d_geometry_str(const Conv2dAttrs& a) {
  auto pair = [](int h, int w) { return std::to_string(h) + "x" + std::to_string(w); };
  return "stride " + pair(a.stride_h, a.stride_w) + ", pad " + pair(a.pad_h, a.pad_w) + ", dilation " +
         pair(a.dilation_h, a.dilation_w) + ", groups " + std::to_string(a.groups);
}

int64_t conv_out_extent(int64_t in, int64_t k, int stride, int pad, int dilation) {
  return (in + 2 * static_cast<int64_t>(pad) - static_cast<int64_t>(dilation) * (k - 1) - 1) / stride + 1;
}

const char* op_name(OpKind kind) { return kOpNames[static_cast<size_t>(kind)]; }

const char* precision_name(Precision p) {
  switch (p) {
    case Precision::kF32: return "f32";
    case Precision::kBF16: return "bf16";
    case Precision::kInt8: return "int8";
  }
  return "?";
}

Precision parse_precision(const std::string& name, const std::string& where) {
  if (name == "f32") return Precision::kF32;
  if (name == "bf16") return Precision::kBF16;
  if (name == "int8") return Precision::kInt8;
  throw Error(ErrorKind::kInvalidInput, "precision '" + name + "'").where(where).expected("f32, bf16 or int8");
}

// ---- weights ----

PreparedWeights Ops::prepare(OpKind kind, OpAttrs attrs, const Tensor& weight, const Tensor* bias) {
  expect_f32(op_name(kind), "", "weight", weight);
  if (bias) {
    expect_rank(op_name(kind), "", "bias", *bias, 1);
    if (bias->size(0) != weight.size(0)) {
      shape_error(op_name(kind), "", "bias " + bias->describe() + " for weight " + weight.describe(),
                  "[" + std::to_string(weight.size(0)) + "]");
    }
  }
  if (weight.device() != Device::kCpu || (bias && bias->device() != Device::kCpu)) {
    shape_error(op_name(kind), "", "weight " + weight.describe() + " in " + device_name(weight.device()) + " memory",
                "host tensors (the checkpoint's); the backend keeps its own prepared copy");
  }
  PreparedWeights p;
  p.kind = kind;
  p.weight_shape = weight.shape();
  p.state = backend_.prepare(kind, attrs, weight, bias);
  p.attrs = std::move(attrs);
  p.backend = &backend_;
  return p;
}

PreparedWeights Ops::prepare_conv2d(const Tensor& weight_oihw, const Tensor* bias, const Conv2dAttrs& attrs) {
  expect_rank("conv2d", "", "weight", weight_oihw, 4);
  return prepare(OpKind::conv2d, attrs, weight_oihw, bias);
}

PreparedWeights Ops::prepare_deform_conv2d(const Tensor& weight_oihw, const Tensor* bias,
                                           const DeformConv2dAttrs& attrs) {
  expect_rank("deform_conv2d", "", "weight", weight_oihw, 4);
  return prepare(OpKind::deform_conv2d, attrs, weight_oihw, bias);
}

PreparedWeights Ops::prepare_linear(const Tensor& weight_out_in, const Tensor* bias, const LinearAttrs& attrs) {
  expect_rank("linear", "", "weight", weight_out_in, 2);
  return prepare(OpKind::linear, attrs, weight_out_in, bias);
}

bool bottleneck_attrs_fusable(const Conv2dAttrs& c1, const Conv2dAttrs& c2, const Conv2dAttrs& c3,
                              const Conv2dAttrs* ds) {
  auto plain = [](const Conv2dAttrs& a, int pad, bool relu, bool residual) {
    return a.stride_h == 1 && a.stride_w == 1 && a.dilation_h == 1 && a.dilation_w == 1 && a.groups == 1 &&
           a.pad_h == pad && a.pad_w == pad && a.relu == relu && a.residual == residual;
  };
  // The fused block reads and writes float activations: a block whose input and output are int8
  // codes (int8 precision) runs conv by conv.
  const bool float_io = c3.int8_out_step == 0 && c3.int8_residual_step == 0 && (!ds || ds->int8_out_step == 0);
  return plain(c1, 0, true, false) && plain(c2, 1, true, false) && plain(c3, 0, true, true) &&
         (!ds || plain(*ds, 0, false, false)) && float_io;
}

bool Ops::bottleneck_fusable(const PreparedWeights& conv1, const PreparedWeights& conv2, const PreparedWeights& conv3,
                             const PreparedWeights* downsample) {
  auto conv_k = [](const PreparedWeights& w, int k) {
    return w.kind == OpKind::conv2d && w.state && w.weight_shape.size() == 4 && w.weight_shape[2] == k &&
           w.weight_shape[3] == k;
  };
  if (!conv_k(conv1, 1) || !conv_k(conv2, 3) || !conv_k(conv3, 1) || (downsample && !conv_k(*downsample, 1)) ||
      !bottleneck_attrs_fusable(std::get<Conv2dAttrs>(conv1.attrs), std::get<Conv2dAttrs>(conv2.attrs),
                                std::get<Conv2dAttrs>(conv3.attrs),
                                downsample ? &std::get<Conv2dAttrs>(downsample->attrs) : nullptr)) {
    return false;
  }
  const int64_t c = conv1.weight_shape[1], p = conv1.weight_shape[0], e = conv3.weight_shape[0];
  return conv2.weight_shape[1] == p && conv3.weight_shape[1] == conv2.weight_shape[0] &&
         (downsample ? downsample->weight_shape[1] == c && downsample->weight_shape[0] == e : c == e);
}

PreparedWeights Ops::prepare_bottleneck(const PreparedWeights& conv1, const PreparedWeights& conv2,
                                        const PreparedWeights& conv3, const PreparedWeights* downsample, DType act) {
  if (!bottleneck_fusable(conv1, conv2, conv3, downsample)) {
    shape_error("bottleneck", "", "convs " + shape_str(conv1.weight_shape) + ", " + shape_str(conv2.weight_shape) + ", " +
                                      shape_str(conv3.weight_shape) + (downsample ? " with a downsample" : ""),
                "a stride-1 bottleneck: 1x1 + ReLU, 3x3 pad 1 + ReLU, 1x1 + residual + ReLU, a 1x1 downsample");
  }
  // u8: conv1 and conv2 write int8 codes of conv2's and conv3's input steps (int8 precision).
  const bool u8_chain = std::get<Conv2dAttrs>(conv1.attrs).int8_out_step > 0 &&
                        std::get<Conv2dAttrs>(conv2.attrs).int8_out_step > 0;
  if (!(act == DType::kF32 || (act == DType::kBF16 && backend_.float_precision() == Precision::kBF16) ||
        (act == DType::kU8 && u8_chain))) {
    shape_error("bottleneck", "", std::string("activations in ") + dtype_name(act),
                "f32, bf16 in bf16 arithmetic, or u8 when conv1 and conv2 have int8 output steps");
  }
  if (u8_chain != (act == DType::kU8)) {
    shape_error("bottleneck", "", std::string("activations in ") + dtype_name(act) + " with convs that write " +
                (u8_chain ? "u8" : "f32"), "the dtype conv1 and conv2 write");
  }
  BottleneckAttrs a;
  a.act = act;
  a.int8 = std::get<Conv2dAttrs>(conv1.attrs).int8_step > 0;
  for (const PreparedWeights* w : {&conv1, &conv2, &conv3, downsample}) {
    if (!w) continue;
    a.members.push_back(w->state);
    a.weight_shapes.push_back(w->weight_shape);
  }
  for (const PreparedWeights* w : {&conv1, &conv2, &conv3, downsample}) {
    if (w && w->backend != &backend_) {
      shape_error("bottleneck", "", "a member conv prepared by another backend", "convs prepared by this Ops' backend");
    }
  }
  PreparedWeights p;
  p.kind = OpKind::bottleneck;
  p.state = backend_.prepare(OpKind::bottleneck, a, Tensor(), nullptr);
  p.attrs = std::move(a);
  p.backend = &backend_;
  return p;
}

// ---- plumbing ----

Tensor Ops::output(const Shape& shape, DType dtype) {
  if (mode_ == Mode::kEager) return backend_.empty(shape, dtype);
  const int64_t n = shape_numel(shape);
  return Tensor::view_of(Storage::deferred(static_cast<size_t>(n) * dtype_size(dtype)), dtype, shape,
                         contiguous_strides(shape), 0);
}

Tensor Ops::emit(OpNode node) {
  for (const Tensor& t : node.inputs) {
    // Kernels read dense rows; a strided view would need a hidden copy (and an allocation in
    // every replay), so views must be made contiguous by an explicit permute.
    if (node.kind != OpKind::permute && !t.is_contiguous()) {
      shape_error(op_name(node.kind), node.label, "input " + t.describe() + " is a strided view",
                  "contiguous inputs (use Ops::permute)");
    }
    // A deferred input is a planned buffer of this recording; anything else must already be the
    // backend's (constants go through Ops::constant).
    if (!t.storage()->is_deferred() && t.device() != backend_.device()) {
      shape_error(op_name(node.kind), node.label, "input " + t.describe() + " is " + device_name(t.device()) + " memory",
                  std::string("memory of the ") + backend_.name() + " backend (Ops::constant uploads a host tensor)");
    }
  }
  node.stage = stage_;
  if (mode_ == Mode::kEager) backend_.run(node);
  Tensor out = node.outputs.front();
  if (mode_ == Mode::kPlan) nodes_.push_back(std::move(node));
  return out;
}

// ---- image ops (NHWC) ----

Tensor Ops::image_preprocess(const Tensor& bgr, const ImagePreprocessAttrs& a, std::string label) {
  const char* op = "image_preprocess";
  expect_rank(op, label, "bgr", bgr, 4);
  if (bgr.dtype() != DType::kU8 || bgr.size(3) != 3) shape_error(op, label, "pixels " + bgr.describe(), "u8 [N, H, W, 3] (BGR)");
  if (a.resized_height <= 0 || a.resized_width <= 0 || a.padded_height < a.resized_height ||
      a.padded_width < a.resized_width) {
    shape_error(op, label,
                "resized " + std::to_string(a.resized_width) + "x" + std::to_string(a.resized_height) + ", padded " +
                    std::to_string(a.padded_width) + "x" + std::to_string(a.padded_height),
                "a positive resized size within the padded size");
  }
  for (const double s : a.std) {
    if (!(s != 0) || !std::isfinite(s)) shape_error(op, label, "std " + std::to_string(s), "finite and nonzero");
  }
  return emit({OpKind::image_preprocess, std::move(label), a, {bgr},
               {output({bgr.size(0), a.padded_height, a.padded_width, 3}, DType::kF32)}, nullptr});
}

Tensor Ops::conv2d(const Tensor& x, const PreparedWeights& w, const Tensor* residual, std::string label, DType out) {
  return conv2d_impl(x, w, residual, std::move(label), out, /*over_residual=*/false);
}

Tensor Ops::conv2d_over_residual(const Tensor& x, const PreparedWeights& w, const Tensor& residual, std::string label,
                                 std::optional<DType> out) {
  return conv2d_impl(x, w, &residual, std::move(label), out.value_or(residual.dtype()), /*over_residual=*/true);
}

Tensor Ops::conv2d_impl(const Tensor& x, const PreparedWeights& w, const Tensor* residual, std::string label, DType out,
                        bool over_residual) {
  expect_rank("conv2d", label, "input", x, 4);
  expect_prepared_by("conv2d", label, w, backend_);
  const auto& a = std::get<Conv2dAttrs>(w.attrs);
  const bool bf16 = backend_.float_precision() == Precision::kBF16;
  // int8 precision: a conv with an int8 input step may read its codes (u8 or s8), one with an
  // output step writes them (u8 after a ReLU, else s8), one with a residual step adds them
  // (Conv2dAttrs). Every other activation is a float, for int8 convs too (they quantize a float
  // input and dequantize into a float output or residual): f32 or, in bf16 arithmetic, bf16.
  const DType in_codes = conv2d_int8_input(a), out_codes = conv2d_int8_output(a), res_codes = conv2d_int8_residual(a);
  const bool int8_in = in_codes != DType::kF32, int8_out = out_codes != DType::kF32, int8_res = res_codes != DType::kF32;
  const char* want = bf16 ? "f32 or bf16" : "f32 (bf16 activations need bf16 arithmetic)";
  if (!(x.dtype() == DType::kF32 || (bf16 && x.dtype() == DType::kBF16) || (int8_in && x.dtype() == in_codes))) {
    shape_error("conv2d", label, "input is " + x.describe(),
                int8_in ? std::string(want) + " or " + dtype_name(in_codes) + " (the conv's int8 input)" : want);
  }
  if (residual && (int8_res ? residual->dtype() != res_codes
                            : !(residual->dtype() == DType::kF32 || (bf16 && residual->dtype() == DType::kBF16)))) {
    shape_error("conv2d", label, "residual is " + residual->describe(),
                int8_res ? std::string(dtype_name(res_codes)) + " (the conv was prepared with an int8 residual step)" : want);
  }
  if (int8_out && a.residual && !int8_res) {
    shape_error("conv2d", label, "an int8 output over an f32 residual", "an int8 residual step with an int8 output step");
  }
  if (int8_out ? out != out_codes : !(out == DType::kF32 || (bf16 && out == DType::kBF16))) {
    shape_error("conv2d", label, std::string("output dtype ") + dtype_name(out) + " requested",
                int8_out ? std::string(dtype_name(out_codes)) + " (the conv was prepared with an int8 output step)" : want);
  }
  const Shape& ws = w.weight_shape;  // O, I/groups, kh, kw
  if (x.size(3) != ws[1] * a.groups) {
    shape_error("conv2d", label, "input " + x.describe() + " (NHWC) for weight " + shape_str(ws),
                std::to_string(ws[1] * a.groups) + " input channels");
  }
  const int64_t ho = conv_out_extent(x.size(1), static_cast<int>(ws[2]), a.stride_h, a.pad_h, a.dilation_h);
  const int64_t wo = conv_out_extent(x.size(2), static_cast<int>(ws[3]), a.stride_w, a.pad_w, a.dilation_w);
  if (ho <= 0 || wo <= 0) shape_error("conv2d", label, "input " + x.describe() + " is smaller than the kernel", "a larger map");
  const Shape out_shape = {x.size(0), ho, wo, ws[0]};
  Tensor y;
  if (over_residual) {
    // The output takes the residual's memory; int8 codes may change their signedness there (a
    // u8 block output over the downsample's s8 identity): the same bytes, read as `out`.
    const bool same_bytes = residual && (residual->dtype() == out || (int8_res && int8_out));
    if (!same_bytes || residual->shape() != out_shape || !residual->is_contiguous()) {
      shape_error("conv2d", label, "residual " + (residual ? residual->describe() : std::string("missing")) +
                  " cannot take the output", std::string("a contiguous ") + dtype_name(out) + shape_str(out_shape));
    }
    y = residual->dtype() == out ? *residual
                                 : Tensor::view_of(residual->storage(), out, out_shape, residual->strides(), residual->offset());
  } else {
    y = output(out_shape, out);
  }
  OpNode n{OpKind::conv2d, std::move(label), w.attrs, {x}, {y}, w.state};
  n.weight_shape = ws;
  if (a.residual) {
    if (!residual) shape_error("conv2d", n.label, "no residual given", "a residual tensor (attrs.residual is set)");
    expect_same_shape("conv2d", n.label, *residual, n.outputs[0]);
    n.inputs.push_back(*residual);
  } else if (residual) {
    shape_error("conv2d", n.label, "a residual was given", "none (attrs.residual is not set)");
  }
  return emit(std::move(n));
}

Tensor Ops::bottleneck(const Tensor& x, const PreparedWeights& block, DType out, bool over_input, std::string label) {
  expect_rank("bottleneck", label, "input", x, 4);
  if (block.kind != OpKind::bottleneck || !block.state) {
    shape_error("bottleneck", label, std::string("weights of a ") + op_name(block.kind), "Ops::prepare_bottleneck's");
  }
  expect_prepared_by("bottleneck", label, block, backend_);
  const auto& a = std::get<BottleneckAttrs>(block.attrs);
  // int8 members read and write f32 at the block's edges: bf16 is for float blocks only.
  const bool bf16 = backend_.float_precision() == Precision::kBF16 && !a.int8;
  for (DType d : {x.dtype(), out}) {
    if (!(d == DType::kF32 || (bf16 && d == DType::kBF16))) {
      shape_error("bottleneck", label, std::string("input ") + x.describe() + ", output dtype " + dtype_name(out),
                  bf16 ? "f32 or bf16" : a.int8 ? "f32 (int8 members)" : "f32 (bf16 activations need bf16 arithmetic)");
    }
  }
  const int64_t c = a.weight_shapes[0][1], e = a.weight_shapes[2][0];
  if (x.size(3) != c) shape_error("bottleneck", label, "input " + x.describe() + " (NHWC)", std::to_string(c) + " channels");
  const Shape out_shape = {x.size(0), x.size(1), x.size(2), e};
  if (over_input && (a.members.size() > 3 || x.dtype() != out || !x.is_contiguous())) {
    shape_error("bottleneck", label, "output over the input " + x.describe(),
                std::string("a block without downsample and an input of the output's dtype ") + dtype_name(out));
  }
  OpNode n{OpKind::bottleneck, std::move(label), block.attrs, {x}, {over_input ? x : output(out_shape, out)}, block.state};
  return emit(std::move(n));
}

Tensor Ops::deform_conv2d(const Tensor& x, const Tensor& offset_mask, const PreparedWeights& w, std::string label,
                          DType out) {
  expect_rank("deform_conv2d", label, "input", x, 4);
  expect_rank("deform_conv2d", label, "offset_mask", offset_mask, 4);
  expect_prepared_by("deform_conv2d", label, w, backend_);
  expect_float_dtype("deform_conv2d", label, "input", x.dtype());
  expect_f32("deform_conv2d", label, "offset_mask", offset_mask);
  const auto& a = std::get<DeformConv2dAttrs>(w.attrs);
  const Shape& ws = w.weight_shape;
  if (x.size(3) != ws[1]) {
    shape_error("deform_conv2d", label, "input " + x.describe() + " for weight " + shape_str(ws),
                std::to_string(ws[1]) + " input channels");
  }
  const int64_t ho = conv_out_extent(x.size(1), static_cast<int>(ws[2]), a.stride, a.pad, a.dilation);
  const int64_t wo = conv_out_extent(x.size(2), static_cast<int>(ws[3]), a.stride, a.pad, a.dilation);
  const Shape om = {x.size(0), ho, wo, 3 * ws[2] * ws[3]};
  if (offset_mask.shape() != om) {
    shape_error("deform_conv2d", label, "offset_mask is " + offset_mask.describe(), "f32" + shape_str(om));
  }
  expect_float_dtype("deform_conv2d", label, "requested output", out);
  OpNode n{OpKind::deform_conv2d, std::move(label), w.attrs, {x, offset_mask}, {output({x.size(0), ho, wo, ws[0]}, out)},
           w.state};
  n.weight_shape = ws;
  return emit(std::move(n));
}

Tensor Ops::max_pool2d(const Tensor& x, std::string label) {
  expect_rank("max_pool2d", label, "input", x, 4);
  const int64_t ho = (x.size(1) - 1) / 2 + 1, wo = (x.size(2) - 1) / 2 + 1;
  return emit({OpKind::max_pool2d, std::move(label), {}, {x}, {output({x.size(0), ho, wo, x.size(3)}, x.dtype())}, nullptr});
}

Tensor Ops::upsample_nearest_add(const Tensor& coarse, const Tensor& fine, std::string label) {
  expect_rank("upsample_nearest_add", label, "coarse", coarse, 4);
  expect_rank("upsample_nearest_add", label, "fine", fine, 4);
  if (coarse.size(0) != fine.size(0) || coarse.size(3) != fine.size(3)) {
    shape_error("upsample_nearest_add", label, coarse.describe() + " onto " + fine.describe(), "equal N and C");
  }
  return emit({OpKind::upsample_nearest_add, std::move(label), {}, {coarse, fine}, {fine}, nullptr});
}

// ---- dense ops ----

Tensor Ops::linear(const Tensor& x, const PreparedWeights& w, std::string label, DType out) {
  expect_prepared_by("linear", label, w, backend_);
  const int64_t in = w.weight_shape[1], out_features = w.weight_shape[0];
  if (x.dim() < 1 || x.size(-1) != in) {
    shape_error("linear", label, "input " + x.describe() + " for weight " + shape_str(w.weight_shape),
                "[..., " + std::to_string(in) + "]");
  }
  expect_float_dtype("linear", label, "input", x.dtype());
  expect_float_dtype("linear", label, "requested output", out);
  Shape ys = x.shape();
  ys.back() = out_features;
  OpNode n{OpKind::linear, std::move(label), w.attrs, {x}, {output(ys, out)}, w.state};
  n.weight_shape = w.weight_shape;
  return emit(std::move(n));
}

Tensor Ops::ffn_norm(const Tensor& x, const PreparedWeights& fc1, const PreparedWeights& fc2, const Tensor& gamma,
                     const Tensor& beta, float eps, DType hidden, std::string label) {
  const char* op = "ffn_norm";
  expect_rank(op, label, "x", x, 2);
  expect_f32(op, label, "x", x);
  expect_float_dtype(op, label, "hidden", hidden);
  expect_prepared_by(op, label, fc1, backend_);
  expect_prepared_by(op, label, fc2, backend_);
  if (linear_relu(fc1) != std::optional<bool>(true) || linear_relu(fc2) != std::optional<bool>(false))
    shape_error(op, label, "layers that are not linears with ReLU then without", "fc1: a linear with ReLU; fc2: without");
  const int64_t c = x.size(1), h = fc1.weight_shape[0];
  if (fc1.weight_shape[1] != c || fc2.weight_shape != Shape{c, h})
    shape_error(op, label, "x " + x.describe() + " for layers " + shape_str(fc1.weight_shape) + " and " +
                               shape_str(fc2.weight_shape), "fc1 [H, C] and fc2 [C, H] with x [M, C]");
  if (gamma.shape() != Shape{c} || beta.shape() != Shape{c})
    shape_error(op, label, "gamma " + gamma.describe() + ", beta " + beta.describe() + " for " + x.describe(),
                "[" + std::to_string(c) + "]");
  FfnNormAttrs a;
  a.fc1 = fc1.state;
  a.fc2 = fc2.state;
  a.fc1_weight_shape = fc1.weight_shape;
  a.fc2_weight_shape = fc2.weight_shape;
  a.hidden = hidden;
  a.eps = eps;
  return emit({OpKind::ffn_norm, std::move(label), std::move(a), {x, gamma, beta}, {output(x.shape())}, nullptr});
}

Tensor Ops::batched_matmul(const Tensor& a, const Tensor& b, const BatchedMatmulAttrs& attrs, std::string label) {
  expect_rank("batched_matmul", label, "a", a, 3);
  expect_rank("batched_matmul", label, "b", b, 3);
  const int64_t k = attrs.transpose_b ? b.size(2) : b.size(1);
  const int64_t n = attrs.transpose_b ? b.size(1) : b.size(2);
  if (a.size(0) != b.size(0) || a.size(2) != k) {
    shape_error("batched_matmul", label, a.describe() + " x " + b.describe() + (attrs.transpose_b ? "^T" : ""),
                "matching batch and inner dimensions");
  }
  return emit({OpKind::batched_matmul, std::move(label), attrs, {a, b}, {output({a.size(0), a.size(1), n})}, nullptr});
}

Tensor Ops::attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionAttrs& attrs, std::string label) {
  expect_rank("attention", label, "q", q, 3);
  expect_rank("attention", label, "k", k, 3);
  expect_rank("attention", label, "v", v, 3);
  const int64_t c = q.size(2);
  if (q.size(0) < 1 || q.size(1) < 1 || c < 1) shape_error("attention", label, "q is " + q.describe(), "non-empty [B, Q, C]");
  if (k.size(0) != q.size(0) || k.size(2) != c || v.shape() != k.shape() || k.size(1) < 1) {
    shape_error("attention", label, "q " + q.describe() + ", k " + k.describe() + ", v " + v.describe(),
                "k and v [B, K, C] for q [B, Q, C]");
  }
  if (attrs.heads < 1 || c % attrs.heads != 0) {
    shape_error("attention", label, std::to_string(attrs.heads) + " heads for " + std::to_string(c) + " channels",
                "C a multiple of heads >= 1");
  }
  return emit({OpKind::attention, std::move(label), attrs, {q, k, v}, {output(q.shape())}, nullptr});
}

Tensor Ops::layer_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps, std::string label) {
  const int64_t c = x.size(-1);
  if (gamma.shape() != Shape{c} || beta.shape() != Shape{c}) {
    shape_error("layer_norm", label, "gamma " + gamma.describe() + ", beta " + beta.describe() + " for " + x.describe(),
                "[" + std::to_string(c) + "]");
  }
  return emit({OpKind::layer_norm, std::move(label), LayerNormAttrs{eps}, {x, gamma, beta}, {output(x.shape())}, nullptr});
}

Tensor Ops::add_layer_norm(const Tensor& x, const Tensor& residual, const Tensor& gamma, const Tensor& beta, float eps,
                           std::string label) {
  expect_f32("layer_norm", label, "x", x);
  expect_f32("layer_norm", label, "residual", residual);
  if (residual.shape() != x.shape())
    shape_error("layer_norm", label, "residual " + residual.describe() + " for " + x.describe(), "x's shape");
  const int64_t c = x.size(-1);
  if (gamma.shape() != Shape{c} || beta.shape() != Shape{c}) {
    shape_error("layer_norm", label, "gamma " + gamma.describe() + ", beta " + beta.describe() + " for " + x.describe(),
                "[" + std::to_string(c) + "]");
  }
  return emit({OpKind::layer_norm, std::move(label), LayerNormAttrs{eps}, {x, gamma, beta, residual},
               {output(x.shape())}, nullptr});
}

Tensor Ops::softmax(const Tensor& x, std::string label) {
  return emit({OpKind::softmax, std::move(label), {}, {x}, {output(x.shape())}, nullptr});
}

Tensor Ops::relu(const Tensor& x, std::string label) {
  return emit({OpKind::relu, std::move(label), {}, {x}, {output(x.shape())}, nullptr});
}

Tensor Ops::sigmoid(const Tensor& x, std::string label) {
  return emit({OpKind::sigmoid, std::move(label), {}, {x}, {output(x.shape())}, nullptr});
}

Tensor Ops::inverse_sigmoid(const Tensor& x, float eps, std::string label) {
  return emit({OpKind::inverse_sigmoid, std::move(label), InverseSigmoidAttrs{eps}, {x}, {output(x.shape())}, nullptr});
}

Tensor Ops::add(const Tensor& a, const Tensor& b, std::string label, DType out) {
  expect_f32("add", label, "a", a);
  expect_f32("add", label, "b", b);
  expect_broadcastable("add", label, a, b);
  expect_float_dtype("add", label, "requested output", out);
  return emit({OpKind::add, std::move(label), {}, {a, b}, {output(a.shape(), out)}, nullptr});
}

Tensor Ops::mul(const Tensor& a, const Tensor& b, std::string label) {
  expect_f32("mul", label, "a", a);
  expect_f32("mul", label, "b", b);
  expect_broadcastable("mul", label, a, b);
  return emit({OpKind::mul, std::move(label), {}, {a, b}, {output(a.shape())}, nullptr});
}

Tensor Ops::zeros(const Shape& shape, std::string label) {
  return emit({OpKind::zeros, std::move(label), {}, {}, {output(shape)}, nullptr});
}

Tensor Ops::add_rows(const Tensor& a, const Tensor& row, std::string label, DType out) {
  if (row.shape() != Shape{a.size(-1)}) {
    shape_error("add_rows", label, "row " + row.describe() + " for " + a.describe(), "[" + std::to_string(a.size(-1)) + "]");
  }
  expect_float_dtype("add_rows", label, "requested output", out);
  return emit({OpKind::add_rows, std::move(label), {}, {a, row}, {output(a.shape(), out)}, nullptr});
}

Tensor Ops::feat_flatten(const std::vector<Tensor>& levels, const std::vector<Tensor>& level_rows,
                         const Tensor& cams_embeds, std::string label, DType out) {
  const char* op = "feat_flatten";
  if (levels.empty()) shape_error(op, label, "no levels", "at least one");
  if (level_rows.size() != levels.size()) {
    shape_error(op, label,
                std::to_string(level_rows.size()) + " level rows for " + std::to_string(levels.size()) + " levels",
                "one per level");
  }
  expect_rank(op, label, "level 0", levels[0], 3);
  const int64_t images = levels[0].size(0), c = levels[0].size(2);
  int64_t total = 0;
  for (size_t l = 0; l < levels.size(); ++l) {
    const std::string name = "level " + std::to_string(l);
    expect_rank(op, label, name.c_str(), levels[l], 3);
    expect_f32(op, label, name.c_str(), levels[l]);
    if (levels[l].size(0) != images || levels[l].size(2) != c) {
      shape_error(op, label, name + " is " + levels[l].describe() + " beside " + levels[0].describe(),
                  "[" + std::to_string(images) + ", hw, " + std::to_string(c) + "]");
    }
    if (!level_rows[l].defined() || level_rows[l].dtype() != DType::kF32 || level_rows[l].shape() != Shape{c}) {
      shape_error(op, label, "level_embeds row " + std::to_string(l) + " is " +
                                 (level_rows[l].defined() ? level_rows[l].describe() : std::string("undefined")),
                  "f32 [" + std::to_string(c) + "]");
    }
    total += levels[l].size(1);
  }
  if (cams_embeds.defined()) {
    expect_rank(op, label, "cams_embeds", cams_embeds, 2);
    expect_f32(op, label, "cams_embeds", cams_embeds);
    if (cams_embeds.size(1) != c || cams_embeds.size(0) < 1 || images % cams_embeds.size(0) != 0) {
      shape_error(op, label, "cams_embeds " + cams_embeds.describe() + " for " + std::to_string(images) + " images",
                  "[cams, " + std::to_string(c) + "] with cams dividing the image count");
    }
  }
  const DType to = copy_dtype(op, label, DType::kF32, out);
  std::vector<Tensor> inputs = levels;
  inputs.insert(inputs.end(), level_rows.begin(), level_rows.end());
  if (cams_embeds.defined()) inputs.push_back(cams_embeds);
  return emit({OpKind::feat_flatten, std::move(label),
               FeatFlattenAttrs{static_cast<int64_t>(levels.size()), cams_embeds.defined()}, std::move(inputs),
               {output({images, total, c}, to)}, nullptr});
}

// ---- attention and selection ----

Tensor Ops::msda(const Tensor& value, const Tensor& locations, const Tensor& weights, const MsdaAttrs& attrs,
                 std::string label) {
  expect_rank("msda", label, "value", value, 4);
  expect_rank("msda", label, "sampling_locations", locations, 6);
  expect_rank("msda", label, "attention_weights", weights, 5);
  // bf16 values (a bf16 linear's output) halve the bytes the corners gather; the rest stays f32.
  if (value.dtype() != DType::kF32 && value.dtype() != DType::kBF16)
    shape_error("msda", label, "value is " + value.describe(), "f32 or bf16");
  expect_f32("msda", label, "sampling_locations", locations);
  expect_f32("msda", label, "attention_weights", weights);
  return emit({OpKind::msda, std::move(label), attrs, {value, locations, weights},
               {output({locations.size(0), locations.size(1), value.size(2) * value.size(3)})}, nullptr});
}

// The checks deformable_attention and spatial_cross_attention share: query [M, C], value [bs, Lv,
// heads, hd], the two projections and the levels; their attributes, points derived.
namespace {

DeformableAttentionAttrs deformable_attrs(const char* op, const std::string& label, const Tensor& query,
                                          const Tensor& value, const PreparedWeights& sampling_offsets,
                                          const PreparedWeights& attention_weights, const MsdaAttrs& levels,
                                          bool softmax_per_level, const Backend& backend) {
  expect_rank(op, label, "query", query, 2);
  expect_rank(op, label, "value", value, 4);
  if (value.dtype() != DType::kF32 && value.dtype() != DType::kBF16)
    shape_error(op, label, "value is " + value.describe(), "f32 or bf16");
  expect_prepared_by(op, label, sampling_offsets, backend);
  expect_prepared_by(op, label, attention_weights, backend);
  if (linear_relu(sampling_offsets) != std::optional<bool>(false) ||
      linear_relu(attention_weights) != std::optional<bool>(false))
    shape_error(op, label, "projections that are not plain linears", "sampling_offsets and attention_weights linears without ReLU");
  const int64_t c = query.size(1), heads = value.size(2);
  const auto n_levels = static_cast<int64_t>(levels.spatial_shapes.size());
  const int64_t per_row = sampling_offsets.weight_shape[0] / 2;  // heads * L * P
  if (n_levels < 1 || static_cast<int64_t>(levels.level_start.size()) != n_levels)
    shape_error(op, label, std::to_string(n_levels) + " level(s) with " + std::to_string(levels.level_start.size()) + " start(s)",
                "one (H, W) and one start per level, at least one level");
  if (sampling_offsets.weight_shape[1] != c || attention_weights.weight_shape[1] != c)
    shape_error(op, label, "query " + query.describe() + " for projections " + shape_str(sampling_offsets.weight_shape) +
                               " and " + shape_str(attention_weights.weight_shape), "[M, in] with the projections' in");
  if (heads < 1 || per_row < 1 || per_row % (heads * n_levels) != 0 || sampling_offsets.weight_shape[0] != 2 * per_row ||
      attention_weights.weight_shape[0] != per_row)
    shape_error(op, label, "projections " + shape_str(sampling_offsets.weight_shape) + " and " +
                               shape_str(attention_weights.weight_shape) + " for value " + value.describe() + " and " +
                               std::to_string(n_levels) + " level(s)",
                "heads * levels * points * 2 offsets and heads * levels * points weights per query");
  DeformableAttentionAttrs a;
  a.msda = levels;
  a.points = per_row / (heads * n_levels);
  a.softmax_per_level = softmax_per_level;
  a.sampling_offsets = sampling_offsets.state;
  a.attention_weights = attention_weights.state;
  a.offsets_weight_shape = sampling_offsets.weight_shape;
  a.weights_weight_shape = attention_weights.weight_shape;
  return a;
}

// reference [rows, 1 or levels, R dividing points, >= 2].
void expect_deformable_reference(const char* op, const std::string& label, const Tensor& reference, int64_t rows,
                                 const char* rows_are, const DeformableAttentionAttrs& a) {
  expect_rank(op, label, "reference", reference, 4);
  expect_f32(op, label, "reference", reference);
  const auto n_levels = static_cast<int64_t>(a.msda.spatial_shapes.size());
  const int64_t lr = reference.size(1), r = reference.size(2);
  if (reference.size(0) != rows || (lr != 1 && lr != n_levels) || r < 1 || a.points % r != 0 || reference.size(3) < 2)
    shape_error(op, label, "reference " + reference.describe() + " for " + std::to_string(rows) + " " + rows_are,
                "[rows, 1 or levels, R dividing " + std::to_string(a.points) + ", >= 2]");
}

}  // namespace

Tensor Ops::deformable_attention(const Tensor& query, const Tensor& reference, const Tensor& value,
                                 const PreparedWeights& sampling_offsets, const PreparedWeights& attention_weights,
                                 const MsdaAttrs& levels, bool softmax_per_level, std::string label) {
  const char* op = "deformable_attention";
  expect_float_dtype(op, label, "query", query.dtype());
  DeformableAttentionAttrs a =
      deformable_attrs(op, label, query, value, sampling_offsets, attention_weights, levels, softmax_per_level, backend_);
  const int64_t rows = query.size(0), bs = value.size(0), heads = value.size(2);
  if (bs < 1 || rows % bs != 0)
    shape_error(op, label, "query " + query.describe() + " for value " + value.describe(), "bs * Lq rows, bs = value's first extent");
  expect_deformable_reference(op, label, reference, rows, "queries", a);
  OpNode n{OpKind::deformable_attention, std::move(label), std::move(a), {query, reference, value},
           {output({rows, heads * value.size(3)})}, nullptr};
  return emit(std::move(n));
}

Tensor Ops::spatial_cross_attention(const Tensor& query, const Tensor& query_index, const Tensor& reference,
                                    const Tensor& inv_count, const Tensor& value, const PreparedWeights& sampling_offsets,
                                    const PreparedWeights& attention_weights, const MsdaAttrs& levels, DType query_dtype,
                                    std::string label, DType out) {
  const char* op = "spatial_cross_attention";
  expect_float_dtype(op, label, "query", query.dtype());
  DeformableAttentionAttrs a =
      deformable_attrs(op, label, query, value, sampling_offsets, attention_weights, levels, /*softmax_per_level=*/false,
                       backend_);
  expect_float_dtype(op, label, "query's rows", query_dtype);
  expect_float_dtype(op, label, "requested output", out);
  a.query_dtype = query_dtype;
  const int64_t cells = query.size(0), cams = value.size(0), heads = value.size(2);
  if (query_index.dtype() != DType::kI64 || query_index.dim() != 1 || cams < 1 || query_index.size(0) % cams != 0)
    shape_error(op, label, "query_index " + query_index.describe() + " for value " + value.describe(),
                "i64 [cameras * max_len], cameras = value's first extent");
  expect_deformable_reference(op, label, reference, query_index.size(0), "slots", a);
  expect_f32(op, label, "inv_count", inv_count);
  if (inv_count.shape() != Shape{cells, 1})
    shape_error(op, label, "inv_count " + inv_count.describe() + " for query " + query.describe(), "[cells, 1]");
  OpNode n{OpKind::spatial_cross_attention, std::move(label), std::move(a), {query, query_index, reference, inv_count, value},
           {output({cells, heads * value.size(3)}, out)}, nullptr};
  return emit(std::move(n));
}

Tensor Ops::sampling_locations(const Tensor& offsets, const Tensor& reference, const SamplingLocationsAttrs& attrs,
                               std::string label) {
  const char* op = "sampling_locations";
  expect_rank(op, label, "offsets", offsets, 5);
  expect_rank(op, label, "reference", reference, 4);
  expect_f32(op, label, "offsets", offsets);
  expect_f32(op, label, "reference", reference);
  const auto levels = static_cast<int64_t>(attrs.spatial_shapes.size());
  if (offsets.size(2) != levels || offsets.size(4) != 2) {
    shape_error(op, label, "offsets " + offsets.describe() + " for " + std::to_string(levels) + " level(s)",
                "[M, heads, " + std::to_string(levels) + ", P, 2]");
  }
  const int64_t lr = reference.size(1), r = reference.size(2);
  if (reference.size(0) != offsets.size(0) || (lr != 1 && lr != levels) || r < 1 || offsets.size(3) % r != 0 ||
      reference.size(3) < 2) {
    shape_error(op, label, "reference " + reference.describe() + " for offsets " + offsets.describe(),
                "[M, 1 or levels, R dividing P, >= 2]");
  }
  return emit({OpKind::sampling_locations, std::move(label), attrs, {offsets, reference}, {output(offsets.shape())},
               nullptr});
}

Tensor Ops::reference_refine(const Tensor& reg, const Tensor& reference, std::string label) {
  expect_rank("reference_refine", label, "reg", reg, 2);
  expect_rank("reference_refine", label, "reference", reference, 2);
  if (reg.size(1) < 5 || reference.shape() != Shape{reg.size(0), 3}) {
    shape_error("reference_refine", label, "reg " + reg.describe() + ", reference " + reference.describe(),
                "reg [M, >= 5] and reference [M, 3]");
  }
  return emit({OpKind::reference_refine, std::move(label), {}, {reg, reference}, {output({reg.size(0), 3})}, nullptr});
}

Tensor Ops::bbox_denormalize(const Tensor& reg, const Tensor& refined, const BboxDenormalizeAttrs& attrs,
                             std::string label) {
  expect_rank("bbox_denormalize", label, "reg", reg, 2);
  expect_rank("bbox_denormalize", label, "refined", refined, 2);
  if (reg.size(1) < 5 || refined.shape() != Shape{reg.size(0), 3}) {
    shape_error("bbox_denormalize", label, "reg " + reg.describe() + ", refined " + refined.describe(),
                "reg [M, >= 5] and refined [M, 3]");
  }
  return emit({OpKind::bbox_denormalize, std::move(label), attrs, {reg, refined}, {output(reg.shape())}, nullptr});
}

std::pair<Tensor, Tensor> Ops::topk(const Tensor& scores, int64_t k, std::string label) {
  expect_rank("topk", label, "scores", scores, 1);
  if (k < 0 || k > scores.size(0)) {
    shape_error("topk", label, "k = " + std::to_string(k) + " of " + scores.describe(), "0 <= k <= n");
  }
  OpNode n{OpKind::topk, std::move(label), TopkAttrs{k}, {scores}, {output({k}), output({k}, DType::kI64)}, nullptr};
  Tensor indices = n.outputs[1];
  Tensor values = emit(std::move(n));
  return {values, indices};
}

void Ops::expect_float_dtype(const char* op, const std::string& label, const char* what, DType dtype) const {
  const bool bf16 = backend_.float_precision() == Precision::kBF16;
  if (!(dtype == DType::kF32 || (bf16 && dtype == DType::kBF16)))
    shape_error(op, label, std::string(what) + " dtype " + dtype_name(dtype),
                bf16 ? "f32 or bf16" : "f32 (bf16 needs bf16 arithmetic: bf16 precision, or int8 on AMX or AMD)");
}

DType Ops::copy_dtype(const char* op, const std::string& label, DType from, std::optional<DType> out) const {
  if (!out || *out == from) return from;
  if (*out == DType::kBF16 && from == DType::kF32 && backend_.float_precision() == Precision::kBF16) return *out;
  shape_error(op, label, std::string(dtype_name(from)) + " rows into " + dtype_name(*out) + " requested",
              "the input's dtype, or bf16 from f32 when the backend runs in bf16");
}

Tensor Ops::gather_rows(const Tensor& src, const Tensor& index, std::string label, std::optional<DType> out) {
  expect_rank("gather_rows", label, "src", src, 2);
  expect_rank("gather_rows", label, "index", index, 1);
  const DType to = copy_dtype("gather_rows", label, src.dtype(), out);
  return emit({OpKind::gather_rows, std::move(label), {}, {src, index}, {output({index.size(0), src.size(1)}, to)}, nullptr});
}

Tensor Ops::scatter_mean_rows(const Tensor& src, const Tensor& index, const Tensor& scale, std::string label,
                              DType out) {
  const char* op = "scatter_mean_rows";
  expect_rank(op, label, "src", src, 2);
  expect_rank(op, label, "scale", scale, 2);
  expect_f32(op, label, "src", src);
  expect_f32(op, label, "scale", scale);
  if (index.dtype() != DType::kI64 || index.shape() != Shape{src.size(0)} || scale.size(1) != 1) {
    shape_error(op, label, src.describe() + " by " + index.describe() + " scaled by " + scale.describe(),
                "src [M, C], index i64 [M], scale [N, 1]");
  }
  expect_float_dtype(op, label, "requested output", out);
  return emit({OpKind::scatter_mean_rows, std::move(label), {}, {src, index, scale},
               {output({scale.size(0), src.size(1)}, out)}, nullptr});
}

Tensor Ops::scatter_add_rows(const Tensor& src, const Tensor& index, const Tensor& dst, std::string label) {
  expect_rank("scatter_add_rows", label, "src", src, 2);
  expect_rank("scatter_add_rows", label, "dst", dst, 2);
  if (index.shape() != Shape{src.size(0)} || src.size(1) != dst.size(1)) {
    shape_error("scatter_add_rows", label, src.describe() + " by " + index.describe() + " into " + dst.describe(),
                "one index per source row and equal widths");
  }
  return emit({OpKind::scatter_add_rows, std::move(label), {}, {src, index}, {dst}, nullptr});
}

Tensor Ops::concat(const std::vector<Tensor>& parts, int64_t axis, std::string label, std::optional<DType> out) {
  if (parts.empty()) shape_error("concat", label, "no tensors", "at least one");
  const DType to = copy_dtype("concat", label, parts.front().dtype(), out);
  Shape s = parts.front().shape();
  if (axis < 0) axis += static_cast<int64_t>(s.size());
  if (axis < 0 || axis >= static_cast<int64_t>(s.size())) shape_error("concat", label, "axis out of range", "a valid axis");
  int64_t total = 0;
  for (const Tensor& p : parts) {
    Shape q = p.shape();
    if (q.size() != s.size()) shape_error("concat", label, p.describe() + " with " + parts.front().describe(), "equal ranks");
    total += q[static_cast<size_t>(axis)];
    q[static_cast<size_t>(axis)] = s[static_cast<size_t>(axis)];
    if (q != s) shape_error("concat", label, p.describe() + " with " + parts.front().describe(), "equal shapes off the axis");
  }
  s[static_cast<size_t>(axis)] = total;
  return emit({OpKind::concat, std::move(label), ConcatAttrs{axis}, parts, {output(s, to)}, nullptr});
}

Tensor Ops::count_nonfinite(const Tensor& x, int64_t groups, std::string label) {
  if (!x.defined() || (x.dtype() != DType::kF32 && x.dtype() != DType::kBF16)) {
    shape_error("count_nonfinite", label, "input " + (x.defined() ? x.describe() : std::string("undefined")), "f32 or bf16");
  }
  if (groups < 1 || x.numel() % groups != 0) {
    shape_error("count_nonfinite", label, std::to_string(groups) + " groups of " + x.describe(),
                "a group count that divides the element count");
  }
  return emit({OpKind::count_nonfinite, std::move(label), CountNonfiniteAttrs{groups}, {x}, {output({groups}, DType::kI64)},
               nullptr});
}

Tensor Ops::gather_rows_multi(const std::vector<Tensor>& srcs, const Tensor& index, std::string label) {
  const char* op = "gather_rows_multi";
  expect_rank(op, label, "index", index, 1);
  if (index.dtype() != DType::kI64) shape_error(op, label, "index is " + index.describe(), "i64");
  if (srcs.empty()) shape_error(op, label, "no sources", "at least one [N, C] tensor");
  for (const Tensor& s : srcs) {
    expect_rank(op, label, "source", s, 2);
    if (s.size(1) != srcs[0].size(1) || s.dtype() != srcs[0].dtype()) {
      shape_error(op, label, "sources " + srcs[0].describe() + " and " + s.describe(), "one width and dtype");
    }
  }
  OpNode n{OpKind::gather_rows_multi, std::move(label), {}, {index}, {output({index.size(0), srcs[0].size(1)}, srcs[0].dtype())},
           nullptr};
  n.inputs.insert(n.inputs.end(), srcs.begin(), srcs.end());
  return emit(std::move(n));
}

Tensor Ops::permute(const Tensor& x, const std::vector<int64_t>& order, std::string label) {
  const Tensor view = x.permute(order);  // validates the order
  return emit({OpKind::permute, std::move(label), PermuteAttrs{order}, {x}, {output(view.shape(), x.dtype())}, nullptr});
}

}  // namespace bev
