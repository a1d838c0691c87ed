#include "backend/cpu/conv2d_int8.h"

#include <algorithm>
#include <array>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <map>
#include <mutex>
#include <span>
#include <vector>

#include "backend/cpu/onednn.h"

namespace bev::cpu {
namespace {

using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;

[[noreturn]] void invalid(const std::string& problem, const std::string& expected) {
  throw Error(ErrorKind::kInvalidInput, problem).where("cpu::Conv2dInt8").expected(expected);
}

// t: a contiguous host tensor of one of `allowed`.
void check_tensor(const char* name, const Tensor& t, std::initializer_list<DType> allowed) {
  const bool ok = t.defined() && t.device() == Device::kCpu && t.is_contiguous() &&
                  std::find(allowed.begin(), allowed.end(), t.dtype()) != allowed.end();
  if (ok) return;
  std::string names;
  size_t i = 0;
  for (const DType d : allowed) {
    names += i == 0 ? "" : i + 1 == allowed.size() ? " or " : ", ";
    names += dtype_name(d);
    ++i;
  }
  throw Error(ErrorKind::kInvalidInput, std::string(name) + " is " + (t.defined() ? t.describe() : "undefined"))
      .where("cpu::Conv2dInt8")
      .expected("a contiguous host " + names + " tensor");
}

}  // namespace

Tensor Conv2dInt8::quantize_weights(const Tensor& weight_oihw, Tensor* scales) {
  cpu::expect_f32_host("cpu::Conv2dInt8", "weight", weight_oihw);
  if (weight_oihw.dim() != 4 || weight_oihw.size(0) < 1) invalid("weight is " + weight_oihw.describe(), "rank 4 OIHW");
  const Tensor w = weight_oihw.contiguous();
  const int64_t o = w.size(0), per = w.numel() / o;
  Tensor q = Tensor::empty(w.shape(), DType::kI8);
  Tensor s = Tensor::empty({o}, DType::kF32);
  const float* wp = w.data<float>();
  int8_t* qp = q.data<int8_t>();
  float* sp = s.data<float>();
  for (int64_t oc = 0; oc < o; ++oc) {
    const float* row = wp + oc * per;
    float m = 0;
    for (int64_t i = 0; i < per; ++i) {
      if (!std::isfinite(row[i])) invalid("weight of output channel " + std::to_string(oc) + " is not finite", "finite weights");
      m = std::max(m, std::fabs(row[i]));
    }
    // A channel of weights under 127 FLT_MIN is zero for int8 (its step would not be normal).
    sp[oc] = m / 127.0f >= FLT_MIN ? m / 127.0f : 1.0f;
    const float inv = 1.0f / sp[oc];
    for (int64_t i = 0; i < per; ++i) {
      qp[oc * per + i] = static_cast<int8_t>(std::clamp(std::nearbyint(row[i] * inv), -127.0f, 127.0f));
    }
  }
  if (scales) *scales = std::move(s);
  return q;
}

struct Conv2dInt8::State {
  Conv2dAttrs attrs;
  DType act = DType::kU8;
  float act_scale = 1;
  int64_t out_ch = 0, in_ch_per_group = 0, kh = 0, kw = 0;
  Tensor q_weights;                // s8 OIHW, the source of every weight layout
  Tensor w_scales;                 // f32 [O]
  std::vector<float> out_scales;   // act_scale * w_scales[o] (/ out step for an int8 output)
  dnnl::memory bias;               // f32 [O] / (act_scale * w_scales[o]): oneDNN 2.x scales conv + bias together
  PackedWeights weights;

  struct Plan {
    dnnl::convolution_forward::primitive_desc pd;
    dnnl::convolution_forward conv;
    dnnl::memory weights, scratchpad;
    dnnl::reorder quantize;          // an f32 input -> src_q
    dnnl::memory src_q;              // unbound: the thread's conversion scratch
    dnnl::reorder copy_residual;     // a separate residual -> y
    dnnl::memory src, dst, residual; // bound per run
    std::mutex mu;
  };
  // N, H, W, the input's dtype, a float output's and a float residual's dtype (f32 or bf16), the lane.
  using Key = std::array<int64_t, 7>;
  std::mutex mu;
  std::map<Key, std::unique_ptr<Plan>> plans;

  int64_t groups() const { return attrs.groups; }
  int64_t in_ch() const { return in_ch_per_group * groups(); }
  DType out() const { return conv2d_int8_output(attrs); }
  DType residual_dtype() const { return conv2d_int8_residual(attrs); }
  // An int8 residual under an int8 output is summed from the output buffer as codes (its bytes
  // copied there when it lies apart); under a float output it is dequantized into the buffer first.
  bool sums_codes() const { return residual_dtype() != DType::kF32 && out() != DType::kF32; }

  dnnl::memory::desc weights_md(tag t) const {
    if (groups() == 1) return {{out_ch, in_ch_per_group, kh, kw}, dt::s8, t == tag::any ? tag::any : tag::oihw};
    return {{groups(), out_ch / groups(), in_ch_per_group, kh, kw}, dt::s8, t == tag::any ? tag::any : tag::goihw};
  }

  // out_dt: the output's dtype, out() or, for a float output, f32 or bf16.
  dnnl::convolution_forward::primitive_desc make_pd(int64_t n, int64_t h, int64_t w, DType out_dt) const {
    const int64_t ho = conv_out_extent(h, kh, attrs.stride_h, attrs.pad_h, attrs.dilation_h);
    const int64_t wo = conv_out_extent(w, kw, attrs.stride_w, attrs.pad_w, attrs.dilation_w);
    const dnnl::memory::desc src_md({n, in_ch(), h, w}, to_dnnl(act), tag::nhwc);
    const dnnl::memory::desc dst_md({n, out_ch, ho, wo}, to_dnnl(out_dt), tag::nhwc);
    const dnnl::memory::desc bias_md = bias ? dnnl::memory::desc({out_ch}, dt::f32, tag::x) : dnnl::memory::desc();
    const dnnl::memory::dims strides = {attrs.stride_h, attrs.stride_w};
    const dnnl::memory::dims dilates = {attrs.dilation_h - 1, attrs.dilation_w - 1};
    const dnnl::memory::dims pad = {attrs.pad_h, attrs.pad_w};
    dnnl::convolution_forward::desc d(dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct,
                                      src_md, weights_md(tag::any), bias_md, dst_md, strides, dilates, pad, pad);
    dnnl::primitive_attr attr;
    attr.set_output_scales(1 << 1, out_scales);  // one per output channel (dst dimension 1)
    dnnl::post_ops ops;
    if (attrs.residual && sums_codes()) {
      // The residual's codes, read from the output buffer in their own dtype (s8 under a u8
      // output: the downsample's identity), rescaled from their step to the output's.
      ops.append_sum(static_cast<float>(static_cast<double>(attrs.int8_residual_step) / attrs.int8_out_step), 0,
                     to_dnnl(residual_dtype()));
    } else if (attrs.residual) {
      ops.append_sum(1.0f);
    }
    if (attrs.relu) ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
    attr.set_post_ops(ops);
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    return {d, attr, engine()};
  }

  Plan& plan_for(int64_t n, int64_t h, int64_t w, DType in, DType out_dt, DType res_dt, int lane) {
    const Key key = {n, h, w, static_cast<int64_t>(in), static_cast<int64_t>(out_dt), static_cast<int64_t>(res_dt), lane};
    std::unique_ptr<Plan>& slot = plans[key];
    if (!slot) {
      try {
        slot = make_plan(n, h, w, in, out_dt, res_dt);
      } catch (...) {
        plans.erase(key);
        throw;
      }
    }
    return *slot;
  }

  std::unique_ptr<Plan> make_plan(int64_t n, int64_t h, int64_t w, DType in, DType out_dt, DType res_dt) {
    auto made = std::make_unique<Plan>();
    Plan& p = *made;
    p.pd = make_pd(n, h, w, out_dt);
    p.weights = weights.in(p.pd.weights_desc());
    p.conv = dnnl::convolution_forward(p.pd);
    p.scratchpad = dnnl::memory(p.pd.scratchpad_desc(), engine());
    const dnnl::memory::desc q_md = p.pd.src_desc();
    if (in == DType::kF32 || in == DType::kBF16) {
      const dnnl::memory::desc float_md({n, in_ch(), h, w}, to_dnnl(in), tag::nhwc);
      p.src = unbound(float_md);
      p.src_q = unbound(q_md);
      p.quantize = dnnl::reorder(quantizer(float_md, q_md));
    } else {
      p.src = unbound(q_md);
    }
    const dnnl::memory::desc dst_md = p.pd.dst_desc();
    if (attrs.residual && !sums_codes()) {
      // A float residual is copied into the output (converted to its dtype); int8 codes under a
      // float output are dequantized into it (x their step). (Codes under an int8 output are
      // copied as bytes.)
      const dnnl::memory::desc res_md({n, out_ch, dst_md.dims()[2], dst_md.dims()[3]}, to_dnnl(res_dt), tag::nhwc);
      dnnl::primitive_attr a;
      if (residual_dtype() != DType::kF32) a.set_output_scales(0, {attrs.int8_residual_step});
      p.residual = unbound(res_md);
      p.copy_residual = dnnl::reorder(dnnl::reorder::primitive_desc(engine(), res_md, engine(), dst_md, a));
    }
    p.dst = unbound(dst_md);
    return made;
  }

  // f32 or bf16 -> act: x * (1 / act_scale), rounded to nearest even and saturated.
  dnnl::reorder::primitive_desc quantizer(const dnnl::memory::desc& from, const dnnl::memory::desc& to) const {
    dnnl::primitive_attr a;
    a.set_output_scales(0, {1.0f / act_scale});
    return dnnl::reorder::primitive_desc(engine(), from, engine(), to, a);
  }
};

Conv2dInt8::Conv2dInt8(const Tensor& weight_oihw, const Tensor* bias, const Conv2dAttrs& attrs, DType act,
                       float act_scale)
    : state_(std::make_unique<State>()) {
  require_precision(Precision::kInt8);  // the registry's refusal, word for word
  State& s = *state_;
  if (act != DType::kU8 && act != DType::kI8) invalid(std::string("activation dtype ") + dtype_name(act), "u8 or i8");
  const auto normal_step = [](float step) { return step >= FLT_MIN && std::isfinite(step) && std::isfinite(1.0f / step); };
  if (!normal_step(act_scale)) {
    invalid("activation scale " + std::to_string(act_scale), "a normal float32 step whose inverse is finite");
  }
  if (!conv2d_geometry_valid(attrs)) {
    invalid("attributes " + conv2d_geometry_str(attrs), "stride, dilation, groups >= 1 and pad >= 0");
  }
  if (attrs.int8_out_step != 0 && !normal_step(attrs.int8_out_step)) {
    invalid("an int8 output of step " + std::to_string(attrs.int8_out_step), "a normal float32 step whose inverse is finite");
  }
  if (attrs.int8_out_step > 0 && attrs.residual && attrs.int8_residual_step == 0) {
    // An f32 residual cannot be summed from an int8 output buffer (it would land there rounded to
    // an integer, not as codes of the output's step).
    invalid("an int8 output over an f32 residual", "an int8 residual (int8_residual_step) under an int8 output");
  }
  if (attrs.int8_residual_step != 0 || attrs.int8_residual_unsigned) {
    if (!attrs.residual || !normal_step(attrs.int8_residual_step)) {
      invalid("an int8 residual of step " + std::to_string(attrs.int8_residual_step) +
                  (attrs.residual ? "" : " on a conv without a residual"),
              "a normal float32 step on a conv with a residual");
    }
    const double ratio = static_cast<double>(attrs.int8_residual_step) / (attrs.int8_out_step > 0 ? attrs.int8_out_step : 1.0);
    if (!(ratio >= FLT_MIN) || !(ratio <= FLT_MAX)) {
      invalid("an int8 residual of step " + std::to_string(attrs.int8_residual_step) + " under an output step of " +
                  std::to_string(attrs.int8_out_step),
              "steps whose ratio is a normal float32");
    }
  }
  s.attrs = attrs;
  s.act = act;
  s.act_scale = act_scale;
  s.q_weights = quantize_weights(weight_oihw, &s.w_scales);
  s.out_ch = s.q_weights.size(0);
  s.in_ch_per_group = s.q_weights.size(1);
  s.kh = s.q_weights.size(2);
  s.kw = s.q_weights.size(3);
  if (s.out_ch % attrs.groups != 0) {
    invalid("weight is " + weight_oihw.describe() + " with groups " + std::to_string(attrs.groups), "O divisible by groups");
  }
  const float* ws = s.w_scales.data<float>();
  s.out_scales.resize(static_cast<size_t>(s.out_ch));
  // The bias below is divided by act_scale * ws[o] alone: oneDNN scales (sum + bias) as one.
  const double out_step = attrs.int8_out_step > 0 ? attrs.int8_out_step : 1.0;
  for (int64_t o = 0; o < s.out_ch; ++o) {
    s.out_scales[o] = static_cast<float>(act_scale * ws[o] / out_step);
    // The bias is stored over act_scale * ws[o]: that must stay a normal float32.
    if (!(static_cast<double>(act_scale) * ws[o] >= FLT_MIN) || !std::isfinite(s.out_scales[o]) || !(s.out_scales[o] > 0)) {
      invalid("activation step " + std::to_string(act_scale) + " with weight step " + std::to_string(ws[o]) +
                  " (output channel " + std::to_string(o) + ")",
              "steps whose product is a normal float32");
    }
  }
  if (bias) {
    cpu::expect_f32_host("cpu::Conv2dInt8", "bias", *bias);
    if (bias->shape() != Shape{s.out_ch}) invalid("bias is " + bias->describe(), "f32[" + std::to_string(s.out_ch) + "]");
    const Tensor b = bias->contiguous();
    s.bias = dnnl::memory({{s.out_ch}, dt::f32, tag::x}, engine());
    float* bp = static_cast<float*>(s.bias.get_data_handle());
    for (int64_t o = 0; o < s.out_ch; ++o) {
      bp[o] = static_cast<float>(static_cast<double>(b.data<float>()[o]) / (static_cast<double>(act_scale) * ws[o]));
    }
  }
  s.weights = PackedWeights(wrap(s.q_weights, s.weights_md(tag::oihw)));
  const int64_t rep_h = (s.kh - 1) * attrs.dilation_h + 1 + 16 * attrs.stride_h;
  const int64_t rep_w = (s.kw - 1) * attrs.dilation_w + 1 + 16 * attrs.stride_w;
  std::lock_guard<std::mutex> lock(s.mu);
  // The weights in the layout a representative map runs on.
  s.plan_for(1, rep_h, rep_w, act, s.out(), attrs.residual ? s.residual_dtype() : DType::kF32, 0);
}

Conv2dInt8::Conv2dInt8(std::unique_ptr<State> state) : state_(std::move(state)) {}

Conv2dInt8 Conv2dInt8::with_attrs(const Conv2dAttrs& attrs) const {
  const State& s = *state_;
  if (attrs.groups != s.attrs.groups || !conv2d_geometry_valid(attrs)) {
    invalid("derived attributes " + conv2d_geometry_str(attrs),
            "groups " + std::to_string(s.attrs.groups) + ", stride and dilation >= 1, pad >= 0");
  }
  if (attrs.int8_out_step != s.attrs.int8_out_step || attrs.int8_step != s.attrs.int8_step ||
      attrs.int8_unsigned != s.attrs.int8_unsigned || attrs.relu != s.attrs.relu || attrs.residual != s.attrs.residual ||
      attrs.int8_residual_step != s.attrs.int8_residual_step ||
      attrs.int8_residual_unsigned != s.attrs.int8_residual_unsigned) {
    invalid("derived attributes with other int8 steps, ReLU or residual", "only the geometry changed");
  }
  auto d = std::make_unique<State>();
  d->attrs = attrs;
  d->act = s.act;
  d->act_scale = s.act_scale;
  d->out_ch = s.out_ch;
  d->in_ch_per_group = s.in_ch_per_group;
  d->kh = s.kh;
  d->kw = s.kw;
  d->q_weights = s.q_weights;  // read-only after construction: the handles may share them
  d->w_scales = s.w_scales;
  d->out_scales = s.out_scales;
  d->bias = s.bias;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    d->weights = s.weights;
  }
  return Conv2dInt8(std::move(d));
}

Conv2dInt8::~Conv2dInt8() = default;
Conv2dInt8::Conv2dInt8(Conv2dInt8&&) noexcept = default;
Conv2dInt8& Conv2dInt8::operator=(Conv2dInt8&&) noexcept = default;

DType Conv2dInt8::act() const { return state_->act; }
float Conv2dInt8::act_scale() const { return state_->act_scale; }
DType Conv2dInt8::out() const { return state_->out(); }
const Tensor& Conv2dInt8::weight_scales() const { return state_->w_scales; }

Shape Conv2dInt8::output_shape(const Shape& in) const {
  const State& s = *state_;
  if (in.size() != 4 || in[3] != s.in_ch() || in[0] < 1) {
    invalid("input shape " + shape_str(in), "rank 4 NHWC with " + std::to_string(s.in_ch()) + " channels");
  }
  const int64_t ho = conv_out_extent(in[1], s.kh, s.attrs.stride_h, s.attrs.pad_h, s.attrs.dilation_h);
  const int64_t wo = conv_out_extent(in[2], s.kw, s.attrs.stride_w, s.attrs.pad_w, s.attrs.dilation_w);
  if (in[1] < 1 || in[2] < 1 || ho < 1 || wo < 1) invalid("input shape " + shape_str(in), "a map the kernel fits");
  return {in[0], ho, wo, s.out_ch};
}

double Conv2dInt8::flops(const Shape& in) const {
  const Shape out = output_shape(in);
  const State& s = *state_;
  return 2.0 * static_cast<double>(out[0] * out[1] * out[2] * out[3]) * static_cast<double>(s.in_ch_per_group * s.kh * s.kw);
}

std::string Conv2dInt8::impl_name(const Shape& in) const {
  output_shape(in);
  std::lock_guard<std::mutex> lock(state_->mu);
  const DType res = state_->attrs.residual ? state_->residual_dtype() : DType::kF32;
  return cpu::impl_name(state_->plan_for(in[0], in[1], in[2], state_->act, state_->out(), res, 0).pd);
}

void Conv2dInt8::quantize(const Tensor& x, Tensor& q) const {
  const State& s = *state_;
  check_tensor("input", x, {DType::kF32});
  check_tensor("output", q, {s.act});
  if (q.shape() != x.shape()) invalid("output is " + q.describe() + " for input " + x.describe(), "the input's shape");
  // A primitive per call: this is for tests and calibration, not the frame (run() keeps its own).
  const dnnl::memory::desc from = plain_desc(x), to = plain_desc(q);
  dnnl::reorder r(s.quantizer(from, to));
  dnnl::stream& st = stream();
  execute_reorder(r, st, wrap(x, from), wrap(q, to));
  st.wait();
}

void Conv2dInt8::run(const Tensor& x, const Tensor* residual, Tensor& y, int lane) const {
  State& s = *state_;
  // Floats are f32 or bf16 (the backend's float arithmetic on AMX), codes as the attrs say.
  check_tensor("input", x, {DType::kF32, DType::kBF16, s.act});
  const Shape out = output_shape(x.shape());
  if (s.out() == DType::kF32) {
    check_tensor("output", y, {DType::kF32, DType::kBF16});
  } else {
    check_tensor("output", y, {s.out()});
  }
  const DType res_dt = s.residual_dtype();
  if (y.shape() != out) invalid("output is " + y.describe() + " for input " + x.describe(), "shape " + shape_str(out));
  if (overlaps(x, y)) invalid("output " + y.describe() + " overlaps input " + x.describe(), "disjoint tensors");
  bool in_place = false;
  if (s.attrs.residual) {
    if (!residual) {
      invalid("no residual given", std::string("a residual ") + dtype_name(res_dt) + shape_str(out) + " (attrs.residual is set)");
    }
    if (res_dt == DType::kF32) {
      check_tensor("residual", *residual, {DType::kF32, DType::kBF16});
    } else {
      check_tensor("residual", *residual, {res_dt});
    }
    if (residual->shape() != out) invalid("residual is " + residual->describe(), "shape " + shape_str(out));
    in_place = residual->raw_data() == y.raw_data();
    // In place the output buffer holds the residual: its bytes are what the sum reads, so the
    // two must be the same size (an s8 identity under a u8 output is; f32 under u8 is not).
    if (in_place && dtype_size(residual->dtype()) != dtype_size(y.dtype())) {
      invalid("the residual " + residual->describe() + " is the output " + y.describe() + " itself",
              "a residual apart, or one of the output's element size");
    }
    if (!in_place && overlaps(*residual, y)) invalid("residual partly overlaps the output", "the output itself or disjoint");
  } else if (residual) {
    invalid("a residual was given", "none (attrs.residual is not set)");
  }
  if (lane < 0) invalid("lane " + std::to_string(lane), "a lane >= 0");
  State::Plan* plan = nullptr;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    plan = &s.plan_for(out[0], x.size(1), x.size(2), x.dtype(), y.dtype(),
                       s.attrs.residual ? residual->dtype() : DType::kF32, lane);
  }
  State::Plan& p = *plan;
  std::lock_guard<std::mutex> run_lock(p.mu);
  dnnl::stream& st = stream();
  bind(p.dst, y);
  if (s.attrs.residual && !in_place) {
    if (s.sums_codes()) {
      std::memcpy(y.raw_data(), residual->raw_data(), residual->nbytes());
    } else {
      bind(p.residual, *residual);
      execute_reorder(p.copy_residual, st, p.residual, p.dst);
    }
  }
  bind(p.src, x);
  dnnl_memory_t src = p.src.get();
  if (x.dtype() == DType::kF32 || x.dtype() == DType::kBF16) {
    bind_conversion_scratch(p.src_q, 0);
    execute_reorder(p.quantize, st, p.src, p.src_q);
    src = p.src_q.get();
  }
  const dnnl_exec_arg_t args[] = {{DNNL_ARG_SRC, src},
                                  {DNNL_ARG_WEIGHTS, p.weights.get()},
                                  {DNNL_ARG_DST, p.dst.get()},
                                  {DNNL_ARG_SCRATCHPAD, p.scratchpad.get()},
                                  {DNNL_ARG_BIAS, s.bias ? s.bias.get() : nullptr}};
  execute(p.conv, st, std::span(args, s.bias ? 5 : 4));
  st.wait();
}

}  // namespace bev::cpu
