#include "backend/cpu/conv2d.h"

#include "backend/batch_norm.h"

#include <array>
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <vector>

#include "backend/cpu/conv2d_int8.h"
#include "backend/cpu/amx1x1.h"
#include "backend/cpu/direct1x1.h"
#include "backend/cpu/onednn.h"

namespace bev::cpu {
namespace {

using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;

[[noreturn]] void invalid(const std::string& problem, const std::string& expected) {
  throw Error(ErrorKind::kInvalidInput, problem).where("cpu::Conv2d").expected(expected);
}

void check_f32(const char* name, const Tensor& t) { cpu::expect_f32_host("cpu::Conv2d", name, t); }

// An activation (input, output, residual): contiguous host f32, or bf16 when the conv runs in
// bf16 (activations then stay bf16 between convolutions instead of being rounded in every op).
void check_activation(const char* name, const Tensor& t, Precision precision) {
  const bool bf16_ok = precision == Precision::kBF16;
  if (!t.defined() || t.device() != Device::kCpu || !t.is_contiguous() ||
      !(t.dtype() == DType::kF32 || (bf16_ok && t.dtype() == DType::kBF16))) {
    throw Error(ErrorKind::kInvalidInput, std::string(name) + " is " + (t.defined() ? t.describe() : "undefined"))
        .where("cpu::Conv2d")
        .expected(bf16_ok ? "a contiguous host f32 or bf16 tensor" : "a contiguous host f32 tensor (bf16 only in bf16 arithmetic)");
  }
}

dt dtype_of(const Tensor& t) { return t.dtype() == DType::kBF16 ? dt::bf16 : dt::f32; }

// The convs int8 precision leaves to floats (no calibrated step) are convs of its float
// arithmetic in every way (bf16 on AMX and AMD, else f32).
Precision arithmetic_of(Precision p) { return float_arithmetic(p); }

int64_t floor_div(int64_t a, int64_t d) { return a >= 0 ? a / d : -((-a + d - 1) / d); }

// A stride-2 conv over an NHWC map of few channels, run as a stride-1 conv over pairs of columns:
// the same memory read as [n, h, w / 2, 2c] (channel s * c + k of pair j is channel k of column
// 2j + s). oneDNN's bf16 kernels multiply channel pairs, so 3 channels are padded to 4: the 7x7
// stem did 196 products for 147 taps. Over pairs it does 7 x 4 x 6 = 168. Tap j of the pairs'
// kernel at pair x + j - pad_l is column 2(x + j - pad_l) + s = 2x - pad + t, so it holds the
// original tap t = 2(j - pad_l) + s + pad, or zero where t falls outside the kernel.
struct ColumnPairs {
  int64_t kw = 0, pad_l = 0, pad_r = 0;
};

std::optional<ColumnPairs> column_pairs(int64_t w, int64_t kw, int64_t pad, int64_t wo) {
  if (w % 2 != 0) return std::nullopt;
  const int64_t first = floor_div(-pad, 2), last = floor_div(kw - 1 - pad, 2);
  ColumnPairs c;
  c.kw = last - first + 1;
  c.pad_l = -first;
  c.pad_r = (wo - 1) + c.kw - w / 2 - c.pad_l;  // so that the output keeps its wo columns
  if (c.pad_r < 0) return std::nullopt;
  return c;
}

}  // namespace

struct Conv2d::State {
  Conv2dAttrs attrs;
  Precision precision = Precision::kF32;
  int64_t out_ch = 0, in_ch_per_group = 0, kh = 0, kw = 0;
  dnnl::memory bias;  // f32 [O], owned copy; empty when the conv has no bias

  PackedWeights weights;  // the first layout made at construction, for a representative map
  std::shared_ptr<const Direct1x1> direct;  // set when this conv runs on our 1x1 kernel instead
  // The fused bottleneck's kernel for its strips (see amx1x1()): packed on the first call, where
  // amx1x1_ok says it applies (only the blocks that fuse ask; tiny's layer3 and layer4 do not).
  bool amx1x1_ok = false;
  std::shared_ptr<const Amx1x1> amx1x1;
  // Set when it runs in int8 (int8 precision, attrs.int8_step > 0): then nothing above is used.
  std::shared_ptr<const Conv2dInt8> int8;
  // The weights of the column-pairs form (ColumnPairs), where pairs_wanted(); maps of odd width run
  // the plain form.
  PackedWeights pair_weights;
  bool has_pairs = false;  // pair_weights made

  // Everything one input shape needs, created on its first run.
  struct Plan {
    dnnl::convolution_forward::primitive_desc pd;
    dnnl::convolution_forward conv;
    dnnl::memory weights;
    dnnl::memory scratchpad;
    dnnl::memory::desc src_md, dst_md;  // the run's tensors (src f32 or bf16; dst and residual too)
    bool column_pairs = false;  // src_md (and src_bf16's) read the source as ColumnPairs' pairs
    dnnl::reorder to_bf16;  // bf16 mode with an f32 source: f32 NHWC source -> src_bf16
    dnnl::memory src_bf16;  // unbound: the thread's conversion scratch
    dnnl::reorder copy_residual;  // a separate residual tensor -> y (a parallel copy)
    // The run's tensors, bound to these before each run (made once: see cpu::bind).
    dnnl::memory src, dst, residual;

    // A 1x1 stride-1 conv with a residual is a GEMM over pixels, and runs as one in chunks of
    // pixels: conv + bias into a small f32 buffer that stays in cache, then a binary add of the
    // residual (+ ReLU) into y. oneDNN 2.6's sum post-op costs more than the conv itself there:
    // at ResNet-50's layer1 expand (6x120x200, 64 -> 256) bf16 plain 6.5 ms, sum 15.3 ms,
    // chunks 9.2 ms; f32 13.8 / 23.0 / 20.2 ms (docs/PERF.md). The f32 buffer keeps the
    // rounding of the fused form: acc + bias + residual, ReLU, then one rounding to y's dtype.
    struct Piece {
      int64_t pixels = 0;
      dnnl::convolution_forward::primitive_desc pd;
      dnnl::convolution_forward conv;
      dnnl::binary add;
      dnnl::memory weights, scratchpad, add_scratchpad;
      dnnl::memory src, temp, residual, dst;  // unbound except temp (bound to the plan's buffer)
      bool residual_first = true;             // binary's src0 is the residual (else the conv's output)
    };
    std::vector<Piece> pieces;  // empty: one conv with the sum post-op; else [chunk] or [chunk, tail]
    dnnl::memory temp;          // f32 [chunk pixels, out_ch]
    std::mutex mu;              // one run at a time on the plan's bound memory objects
  };
  // N, H, W, the dtypes of source, output and residual, and the lane (see Conv2d::run).
  using Key = std::array<int64_t, 7>;
  std::mutex mu;  // the plan map and the weight layouts
  std::map<Key, std::unique_ptr<Plan>> plans;

  dt src_dt() const { return precision == Precision::kBF16 ? dt::bf16 : dt::f32; }
  int64_t groups() const { return attrs.groups; }

  dnnl::memory::desc weights_any_md() const {
    if (groups() == 1) return {{out_ch, in_ch_per_group, kh, kw}, src_dt(), tag::any};
    return {{groups(), out_ch / groups(), in_ch_per_group, kh, kw}, src_dt(), tag::any};
  }

  // The NHWC source, or the same bytes as pairs of columns: [n, h, w / 2, 2c] (ColumnPairs).
  dnnl::memory::desc source_md(int64_t n, int64_t h, int64_t w, dt type, bool pairs) const {
    const int64_t c = in_ch_per_group * groups();
    if (pairs) return {{n, 2 * c, h, w / 2}, type, tag::nhwc};
    return {{n, c, h, w}, type, tag::nhwc};
  }

  // The residual is added by oneDNN's sum post-op: y must hold it before the conv runs (run()
  // copies a separate residual in first). A binary-add post-op reading the residual tensor directly
  // would save that copy, but oneDNN 2.6 then leaves brgconv_1x1 for the older jit_1x1 kernel:
  // measured on one Zen 5 core at ResNet-50's layer1/layer2 expand convs, binary add 61/76
  // GFLOP/s, copy + sum 76/118, sum in place (no copy) 89/136.
  dnnl::convolution_forward::primitive_desc make_pd(int64_t n, int64_t h, int64_t w, const dnnl::memory::desc& w_md,
                                                    dt out_dt = dt::f32, const ColumnPairs* pairs = nullptr) const {
    const int64_t ho = conv_out_extent(h, kh, attrs.stride_h, attrs.pad_h, attrs.dilation_h);
    const int64_t wo = conv_out_extent(w, kw, attrs.stride_w, attrs.pad_w, attrs.dilation_w);
    const dnnl::memory::desc src_md = source_md(n, h, w, src_dt(), pairs != nullptr);
    const dnnl::memory::desc dst_md({n, out_ch, ho, wo}, out_dt, tag::nhwc);
    const dnnl::memory::desc bias_md = bias ? dnnl::memory::desc({out_ch}, dt::f32, tag::x) : dnnl::memory::desc();
    const dnnl::memory::dims strides = {attrs.stride_h, pairs ? 1 : attrs.stride_w};
    const dnnl::memory::dims dilates = {attrs.dilation_h - 1, attrs.dilation_w - 1};  // oneDNN: 0 = dense
    const dnnl::memory::dims pad_l = {attrs.pad_h, pairs ? pairs->pad_l : attrs.pad_w};
    const dnnl::memory::dims pad_r = {attrs.pad_h, pairs ? pairs->pad_r : attrs.pad_w};
    dnnl::convolution_forward::desc d(dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct,
                                      src_md, w_md, bias_md, dst_md, strides, dilates, pad_l, pad_r);
    dnnl::post_ops ops;
    if (attrs.residual) ops.append_sum(1.0f);
    if (attrs.relu) ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
    dnnl::primitive_attr attr;
    attr.set_post_ops(ops);
    // The plan owns its scratchpad: nothing is allocated per run and concurrent plans never share.
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    return {d, attr, engine()};
  }

  // Column pairs (ColumnPairs) where oneDNN pads channel pairs and its bf16 runs at twice f32's
  // rate without AMX: AMD's avx512_bf16 (the AMX tiles block channels otherwise; not measured).
  // BEVFormer's stem, Zen 4, 2 threads, in the bf16 profile (docs/PERF.md): tiny 35.7-37.4 ->
  // 30.0-31.9 ms, base 137.7-138.8 -> 119.9-121.8 ms. In f32 the pairs were slower (52-54 -> 57-58 ms).
  bool pairs_wanted() const {
    return precision == Precision::kBF16 && bf16_outruns_f32() && !isa_has_amx() && groups() == 1 &&
           attrs.stride_w == 2 && attrs.dilation_w == 1 && in_ch_per_group % 2 == 1 && in_ch_per_group <= 7 &&
           !attrs.residual;
  }
  std::optional<ColumnPairs> pairs_geometry(int64_t w) const {
    if (!pairs_wanted()) return std::nullopt;
    return column_pairs(w, kw, attrs.pad_w, conv_out_extent(w, kw, attrs.stride_w, attrs.pad_w, attrs.dilation_w));
  }
  dnnl::memory::desc pair_weights_any_md(const ColumnPairs& c) const {
    return {{out_ch, 2 * in_ch_per_group, kh, c.kw}, src_dt(), tag::any};
  }

  // Not on AMX, where oneDNN's sum post-op is the faster form (tiny's in-place expand convs on the
  // AMX Xeon, 2 threads, pieces -> sum: bf16 layer1 15.0 -> 9.8 ms, layer2 8.7 -> 3.8, layer3
  // 4.7 -> 2.4; f32 20.8 -> 20.4, 15.1 -> 14.2, 13.1 -> 13.2).
  bool pixel_gemm() const {
    if (isa_has_amx()) return false;
    return attrs.residual && groups() == 1 && kh == 1 && kw == 1 && attrs.stride_h == 1 && attrs.stride_w == 1 &&
           attrs.pad_h == 0 && attrs.pad_w == 0;
  }

  // The conv over `pixels` pixels as a [1, C, 1, pixels] map, bias only (no post-ops).
  dnnl::convolution_forward::primitive_desc make_pixel_pd(int64_t pixels) const {
    const dnnl::memory::desc src_md({1, in_ch_per_group, 1, pixels}, src_dt(), tag::nhwc);
    const dnnl::memory::desc dst_md({1, out_ch, 1, pixels}, dt::f32, tag::nhwc);
    const dnnl::memory::desc bias_md = bias ? dnnl::memory::desc({out_ch}, dt::f32, tag::x) : dnnl::memory::desc();
    dnnl::convolution_forward::desc d(dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct,
                                      src_md, weights_any_md(), bias_md, dst_md, {1, 1}, {0, 0}, {0, 0}, {0, 0});
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    return {d, attr, engine()};
  }

  // Pieces of `total` pixels for a residual in res_dt and an output in out_dt; empty when oneDNN
  // has no fast binary add for these dtypes (the run then keeps the sum post-op).
  std::vector<Plan::Piece> make_pieces(int64_t total, dt res_dt, dt out_dt, dnnl::memory& temp) {
    // Measured at tiny's expand convs: 2-16 MiB all run within noise of each other (±15% on this
    // shared machine); 1 MiB is slower. 4 MiB per plan keeps the buffers at 64 MiB for tiny.
    constexpr int64_t kTempBytes = 4 << 20;
    const int64_t chunk = std::min(total, std::max<int64_t>(256, kTempBytes / (out_ch * 4)));
    std::vector<Plan::Piece> pieces;
    try {
      temp = dnnl::memory({{chunk * out_ch}, dt::f32, tag::x}, engine());
      for (int64_t pixels : {chunk, total % chunk}) {
        if (pixels == 0 || (!pieces.empty() && pixels == chunk)) continue;
        Plan::Piece q;
        q.pixels = pixels;
        q.pd = make_pixel_pd(pixels);
        q.conv = dnnl::convolution_forward(q.pd);
        q.weights = weights.in(q.pd.weights_desc());
        q.scratchpad = dnnl::memory(q.pd.scratchpad_desc(), engine());
        const dnnl::memory::desc temp_md({1, out_ch, 1, pixels}, dt::f32, tag::nhwc);
        const dnnl::memory::desc res_md({1, out_ch, 1, pixels}, res_dt, tag::nhwc);
        const dnnl::memory::desc out_md({1, out_ch, 1, pixels}, out_dt, tag::nhwc);
        dnnl::post_ops ops;
        if (attrs.relu) ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
        dnnl::primitive_attr attr;
        attr.set_post_ops(ops);
        attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
        // oneDNN 2.6's fast binary (jit:uni) wants src0 in dst's dtype; otherwise it falls back to a
        // slow reference kernel, whose ReLU also writes -0 for negative inputs where jit:uni and
        // the sum post-op write +0. The residual goes first when its dtype is y's, so y may be the
        // residual itself (binary runs in place on src0).
        q.residual_first = res_dt == out_dt;
        if (!q.residual_first && out_dt != dt::f32) return {};
        const dnnl::binary::primitive_desc add_pd(
            q.residual_first ? dnnl::binary::desc(dnnl::algorithm::binary_add, res_md, temp_md, out_md)
                             : dnnl::binary::desc(dnnl::algorithm::binary_add, temp_md, res_md, out_md),
            attr, engine());
        if (cpu::impl_name(add_pd).rfind("ref", 0) == 0) return {};
        q.add = dnnl::binary(add_pd);
        q.add_scratchpad = dnnl::memory(add_pd.scratchpad_desc(), engine());
        q.src = unbound(q.pd.src_desc());
        q.temp = dnnl::memory(temp_md, engine(), temp.get_data_handle());
        q.residual = unbound(res_md);
        q.dst = unbound(out_md);
        pieces.push_back(std::move(q));
      }
    } catch (const dnnl::error&) {
      pieces.clear();
    }
    return pieces;
  }

  void run_pieces(Plan& p, const Tensor& x, const Tensor& residual, Tensor& y) {
    dnnl::stream& st = stream();
    const char* src = static_cast<const char*>(x.raw_data());
    if (p.to_bf16) {
      bind(p.src, x);
      bind_conversion_scratch(p.src_bf16, 0);
      execute_reorder(p.to_bf16, st, p.src, p.src_bf16);
      src = static_cast<const char*>(p.src_bf16.get_data_handle());
    }
    const int64_t src_px = in_ch_per_group * (src_dt() == dt::bf16 ? 2 : 4);
    const int64_t res_px = out_ch * static_cast<int64_t>(dtype_size(residual.dtype()));
    const int64_t dst_px = out_ch * static_cast<int64_t>(dtype_size(y.dtype()));
    const auto* res = static_cast<const char*>(residual.raw_data());
    auto* dst = static_cast<char*>(y.raw_data());
    const int64_t total = x.size(0) * x.size(1) * x.size(2);
    for (int64_t at = 0; at < total;) {
      Plan::Piece& q = total - at >= p.pieces.front().pixels ? p.pieces.front() : p.pieces.back();
      bind(q.src, const_cast<char*>(src + at * src_px));
      bind(q.residual, const_cast<char*>(res + at * res_px));
      bind(q.dst, dst + at * dst_px);
      const dnnl_exec_arg_t conv_args[] = {{DNNL_ARG_SRC, q.src.get()},
                                           {DNNL_ARG_WEIGHTS, q.weights.get()},
                                           {DNNL_ARG_DST, q.temp.get()},
                                           {DNNL_ARG_SCRATCHPAD, q.scratchpad.get()},
                                           {DNNL_ARG_BIAS, bias ? bias.get() : nullptr}};
      execute(q.conv, st, std::span(conv_args, bias ? 5 : 4));
      execute(q.add, st,
              {{DNNL_ARG_SRC_0, q.residual_first ? q.residual.get() : q.temp.get()},
               {DNNL_ARG_SRC_1, q.residual_first ? q.temp.get() : q.residual.get()},
               {DNNL_ARG_DST, q.dst.get()},
               {DNNL_ARG_SCRATCHPAD, q.add_scratchpad.get()}});
      at += q.pixels;
    }
    st.wait();
  }

  Plan& plan_for(int64_t n, int64_t h, int64_t w, dt in_dt = dt::f32, dt out_dt = dt::f32, dt res_dt = dt::f32,
                 int lane = 0) {
    const Key key = {n, h, w, static_cast<int64_t>(in_dt), static_cast<int64_t>(out_dt), static_cast<int64_t>(res_dt),
                     lane};
    std::unique_ptr<Plan>& slot = plans[key];
    if (!slot) {
      try {
        slot = make_plan(n, h, w, in_dt, out_dt, res_dt);
      } catch (...) {
        plans.erase(key);
        throw;
      }
    }
    return *slot;
  }

  std::unique_ptr<Plan> make_plan(int64_t n, int64_t h, int64_t w, dt in_dt, dt out_dt, dt res_dt) {
    auto made = std::make_unique<Plan>();
    Plan& p = *made;
    // Pixel chunks are for 1x1 residual convs and column pairs for stride-2 convs without one:
    // never both.
    const std::optional<ColumnPairs> pairs = has_pairs ? pairs_geometry(w) : std::nullopt;
    p.column_pairs = pairs.has_value();
    p.src_md = source_md(n, h, w, in_dt, p.column_pairs);
    if (precision == Precision::kBF16 && in_dt == dt::f32) {
      const dnnl::memory::desc bf16_md = source_md(n, h, w, dt::bf16, p.column_pairs);
      p.src_bf16 = unbound(bf16_md);  // bound to this thread's conversion scratch per run
      p.to_bf16 = dnnl::reorder(dnnl::reorder::primitive_desc(engine(), p.src_md, engine(), bf16_md));
    }
    p.src = unbound(p.src_md);
    if (pixel_gemm()) p.pieces = make_pieces(n * h * w, res_dt, out_dt, p.temp);
    if (p.pieces.empty()) p.temp = dnnl::memory();
    if (!p.pieces.empty()) return made;

    if (pairs) {
      p.pd = make_pd(n, h, w, pair_weights_any_md(*pairs), out_dt, &*pairs);
      p.weights = pair_weights.in(p.pd.weights_desc());
    } else {
      p.pd = make_pd(n, h, w, weights_any_md(), out_dt);
      p.weights = weights.in(p.pd.weights_desc());
    }
    p.conv = dnnl::convolution_forward(p.pd);
    p.scratchpad = dnnl::memory(p.pd.scratchpad_desc(), engine());
    p.dst_md = p.pd.dst_desc();
    if (attrs.residual) {
      const dnnl::memory::desc res_md({n, out_ch, p.dst_md.dims()[2], p.dst_md.dims()[3]}, res_dt, tag::nhwc);
      p.copy_residual = dnnl::reorder(dnnl::reorder::primitive_desc(engine(), res_md, engine(), p.dst_md));
      p.residual = unbound(res_md);
    }
    p.dst = unbound(p.dst_md);
    return made;
  }
};

Conv2d::Conv2d(const Tensor& weight_oihw, const Tensor* bias, const Conv2dAttrs& attrs, Precision precision,
               bool allow_direct)
    : state_(std::make_unique<State>()) {
  State& s = *state_;
  s.attrs = attrs;
  s.precision = precision;
  check_f32("weight", weight_oihw);
  if (weight_oihw.dim() != 4) invalid("weight is " + weight_oihw.describe(), "rank 4 OIHW");
  if (!conv2d_geometry_valid(attrs)) {
    invalid("attributes " + conv2d_geometry_str(attrs), "stride, dilation, groups >= 1 and pad >= 0");
  }
  s.out_ch = weight_oihw.size(0);
  s.in_ch_per_group = weight_oihw.size(1);
  s.kh = weight_oihw.size(2);
  s.kw = weight_oihw.size(3);
  if (s.out_ch < 1 || s.in_ch_per_group < 1 || s.kh < 1 || s.kw < 1 || s.out_ch % attrs.groups != 0) {
    invalid("weight is " + weight_oihw.describe() + " with groups " + std::to_string(attrs.groups),
            "non-empty extents and O divisible by groups");
  }
  if (attrs.int8_step == 0 && (attrs.int8_out_step != 0 || attrs.int8_unsigned || attrs.int8_residual_step != 0 ||
                               attrs.int8_residual_unsigned)) {
    invalid("an int8 output, residual or u8 input without an int8 input step", "int8_step > 0 with them");
  }
  if (attrs.int8_step != 0) {
    if (precision != Precision::kInt8) {
      invalid("an int8 input step in " + std::string(precision_name(precision)) + " precision", "int8 precision");
    }
    // Conv2dInt8 checks the step and the CPU, quantizes the weights and packs them; nothing in f32.
    s.int8 = std::make_shared<const Conv2dInt8>(weight_oihw, bias, attrs,
                                                conv2d_int8_input(attrs), attrs.int8_step);
    return;
  }
  const Precision arithmetic = arithmetic_of(precision);
  s.precision = arithmetic;  // what its dtypes and kernels follow from here on
  if (bias) {
    check_f32("bias", *bias);
    if (bias->shape() != Shape{s.out_ch}) invalid("bias is " + bias->describe(), "f32[" + std::to_string(s.out_ch) + "]");
    const Tensor b = bias->contiguous();
    s.bias = dnnl::memory({{s.out_ch}, dt::f32, tag::x}, engine());
    std::memcpy(s.bias.get_data_handle(), b.raw_data(), b.nbytes());
  }

  // Reorder (and in bf16 mode round) the weights once into the layout a kernel prefers for a
  // representative map; the kernels for other maps of the same conv almost always agree.
  const Tensor w = weight_oihw.contiguous();
  const dnnl::memory::desc user_md =
      attrs.groups == 1
          ? dnnl::memory::desc({s.out_ch, s.in_ch_per_group, s.kh, s.kw}, dt::f32, tag::oihw)
          : dnnl::memory::desc({attrs.groups, s.out_ch / attrs.groups, s.in_ch_per_group, s.kh, s.kw}, dt::f32,
                               tag::goihw);
  dnnl::memory user = wrap(w, user_md);
  const int64_t rep_h = (s.kh - 1) * attrs.dilation_h + 1 + 16 * attrs.stride_h;
  const int64_t rep_w = (s.kw - 1) * attrs.dilation_w + 1 + 16 * attrs.stride_w;
  const auto pd = s.make_pd(1, rep_h, rep_w, s.weights_any_md());
  s.weights = PackedWeights(reordered(user, pd.weights_desc()));
  if (const std::optional<ColumnPairs> pairs = s.pairs_geometry(2 * rep_w)) {
    // [O, 2C, kh, kw'] from [O, C, kh, kw] (ColumnPairs); the rest zeros. Rounded to bf16 with
    // the same values as the plain form's.
    const int64_t c = s.in_ch_per_group;
    Tensor pw = Tensor::zeros({s.out_ch, 2 * c, s.kh, pairs->kw}, DType::kF32);
    const float* src = w.data<float>();
    float* dst = pw.data<float>();
    for (int64_t o = 0; o < s.out_ch; ++o)
      for (int64_t half = 0; half < 2; ++half)
        for (int64_t k = 0; k < c; ++k)
          for (int64_t i = 0; i < s.kh; ++i)
            for (int64_t j = 0; j < pairs->kw; ++j) {
              const int64_t t = 2 * (j - pairs->pad_l) + half + attrs.pad_w;
              if (t < 0 || t >= s.kw) continue;
              dst[((o * 2 * c + half * c + k) * s.kh + i) * pairs->kw + j] = src[((o * c + k) * s.kh + i) * s.kw + t];
            }
    const dnnl::memory::desc pair_md({s.out_ch, 2 * c, s.kh, pairs->kw}, dt::f32, tag::oihw);
    const auto pair_pd = s.make_pd(1, rep_h, 2 * rep_w, s.pair_weights_any_md(*pairs), dt::f32, &*pairs);
    s.pair_weights = PackedWeights(reordered(wrap(pw, pair_md), pair_pd.weights_desc()));
    s.has_pairs = true;
  }
  if (allow_direct && Direct1x1::supports(attrs, s.in_ch_per_group * attrs.groups, s.out_ch, s.kh, s.kw, arithmetic)) {
    s.direct = std::make_shared<const Direct1x1>(w, bias, attrs.relu);
  }
  s.amx1x1_ok = allow_direct && Amx1x1::supports(attrs, s.in_ch_per_group * attrs.groups, s.out_ch, s.kh, s.kw, arithmetic);
}

Conv2d::Conv2d(std::unique_ptr<State> state) : state_(std::move(state)) {}

Conv2d Conv2d::with_attrs(const Conv2dAttrs& attrs) const {
  const State& s = *state_;
  if (attrs.groups != s.attrs.groups || !conv2d_geometry_valid(attrs)) {
    invalid("derived attributes " + conv2d_geometry_str(attrs),
            "groups " + std::to_string(s.attrs.groups) + ", stride and dilation >= 1, pad >= 0");
  }
  auto d = std::make_unique<State>();
  d->attrs = attrs;
  d->precision = s.precision;
  d->out_ch = s.out_ch;
  d->in_ch_per_group = s.in_ch_per_group;
  d->kh = s.kh;
  d->kw = s.kw;
  d->bias = s.bias;  // read-only after construction: the handles may share it
  if (s.int8) {
    d->int8 = std::make_shared<const Conv2dInt8>(s.int8->with_attrs(attrs));
    return Conv2d(std::move(d));
  }
  if (s.direct && attrs.relu == s.attrs.relu &&
      Direct1x1::supports(attrs, s.in_ch_per_group * attrs.groups, s.out_ch, s.kh, s.kw, arithmetic_of(s.precision))) {
    d->direct = s.direct;
  }
  d->amx1x1_ok = s.amx1x1_ok && attrs.relu == s.attrs.relu &&
                 Amx1x1::supports(attrs, s.in_ch_per_group * attrs.groups, s.out_ch, s.kh, s.kw,
                                  arithmetic_of(s.precision));
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    d->weights = s.weights;
    // The pairs' kernel follows the width's stride, padding and dilation: kept only with them.
    d->has_pairs = s.has_pairs && attrs.stride_w == s.attrs.stride_w && attrs.pad_w == s.attrs.pad_w &&
                   attrs.dilation_w == s.attrs.dilation_w && d->pairs_wanted();
    if (d->has_pairs) d->pair_weights = s.pair_weights;
    if (d->amx1x1_ok) d->amx1x1 = s.amx1x1;
  }
  return Conv2d(std::move(d));
}

Conv2d::~Conv2d() = default;
Conv2d::Conv2d(Conv2d&&) noexcept = default;
Conv2d& Conv2d::operator=(Conv2d&&) noexcept = default;

const Conv2dAttrs& Conv2d::attrs() const { return state_->attrs; }
const Amx1x1* Conv2d::amx1x1() const {
  State& s = *state_;
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.amx1x1_ok && !s.amx1x1) {
    // From the packed weights, already bf16: back to f32 OIHW exactly, which Amx1x1 rounds to the
    // same bf16 again.
    Tensor w = Tensor::empty({s.out_ch, s.in_ch_per_group, 1, 1}, DType::kF32);
    const dnnl::memory plain = s.weights.copy_in(dnnl::memory::desc({s.out_ch, s.in_ch_per_group, 1, 1}, dt::f32, tag::oihw));
    std::memcpy(w.raw_data(), plain.get_data_handle(), w.nbytes());
    Tensor b;
    if (s.bias) {
      b = Tensor::empty({s.out_ch}, DType::kF32);
      std::memcpy(b.raw_data(), s.bias.get_data_handle(), b.nbytes());
    }
    s.amx1x1 = std::make_shared<const Amx1x1>(w, b.defined() ? &b : nullptr, s.attrs.relu);
  }
  return s.amx1x1.get();
}
int64_t Conv2d::in_channels() const { return state_->in_ch_per_group * state_->attrs.groups; }
int64_t Conv2d::out_channels() const { return state_->out_ch; }
Precision Conv2d::precision() const { return state_->precision; }

Shape Conv2d::output_shape(const Shape& in) const {
  const State& s = *state_;
  const int64_t c = s.in_ch_per_group * s.attrs.groups;
  if (in.size() != 4) invalid("input shape " + shape_str(in), "rank 4 NHWC");
  if (in[3] != c) invalid("input shape " + shape_str(in) + " (NHWC)", std::to_string(c) + " channels");
  if (in[0] < 1) invalid("input shape " + shape_str(in), "at least one image");
  const int64_t ho = conv_out_extent(in[1], s.kh, s.attrs.stride_h, s.attrs.pad_h, s.attrs.dilation_h);
  const int64_t wo = conv_out_extent(in[2], s.kw, s.attrs.stride_w, s.attrs.pad_w, s.attrs.dilation_w);
  if (in[1] < 1 || in[2] < 1 || ho < 1 || wo < 1) {
    invalid("input shape " + shape_str(in) + " gives an empty output for a " + std::to_string(s.kh) + "x" +
                std::to_string(s.kw) + " kernel",
            "a map at least as large as the dilated kernel minus padding");
  }
  return {in[0], ho, wo, s.out_ch};
}

double Conv2d::flops(const Shape& in) const {
  const Shape out = output_shape(in);
  const State& s = *state_;
  return 2.0 * static_cast<double>(out[0] * out[1] * out[2] * out[3]) *
         static_cast<double>(s.in_ch_per_group * s.kh * s.kw);
}

std::string Conv2d::impl_name(const Shape& in) const {
  output_shape(in);  // validates
  if (state_->int8) return state_->int8->impl_name(in);
  if (state_->direct) return "bev:direct1x1:avx512";
  std::lock_guard<std::mutex> lock(state_->mu);
  const State::Plan& p = state_->plan_for(in[0], in[1], in[2]);  // the descriptors only: no run lock
  if (p.pieces.empty()) return cpu::impl_name(p.pd) + (p.column_pairs ? " over column pairs" : "");
  return cpu::impl_name(p.pieces[0].pd) + " in chunks of " + std::to_string(p.pieces[0].pixels) + " px + binary add";
}

void Conv2d::run(const Tensor& x, const Tensor* residual, Tensor& y, int lane) const {
  State& s = *state_;
  if (s.int8) {  // its own dtype checks: f32 or u8/s8 input, output and residual as its attrs say
    s.int8->run(x, residual, y, lane);
    return;
  }
  check_activation("input", x, s.precision);
  const Shape out = output_shape(x.shape());
  check_activation("output", y, s.precision);
  if (y.shape() != out) invalid("output is " + y.describe() + " for input " + x.describe(), "shape " + shape_str(out));
  if (overlaps(x, y)) invalid("output " + y.describe() + " overlaps input " + x.describe(), "disjoint tensors");
  bool in_place = false;
  if (s.attrs.residual) {
    if (!residual) invalid("no residual given", "a residual f32" + shape_str(out) + " (attrs.residual is set)");
    check_activation("residual", *residual, s.precision);
    if (residual->shape() != out) invalid("residual is " + residual->describe(), "shape " + shape_str(out));
    in_place = residual->raw_data() == y.raw_data();
    if (in_place && residual->dtype() != y.dtype()) {
      invalid("the residual is the output itself but " + residual->describe(), "the output's dtype " + y.describe());
    }
    if (!in_place && overlaps(*residual, y)) {
      invalid("residual " + residual->describe() + " partly overlaps the output", "the output itself or disjoint");
    }
  } else if (residual) {
    invalid("a residual was given", "none (attrs.residual is not set)");
  }

  if (lane < 0) invalid("lane " + std::to_string(lane), "a lane >= 0");
  if (s.direct) {  // f32 precision: x and y are f32 (check_activation); stateless, so no plan or lock
    s.direct->run(x.data<float>(), y.data<float>(), out[0] * out[1] * out[2]);
    return;
  }
  State::Plan* plan = nullptr;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    plan = &s.plan_for(out[0], x.size(1), x.size(2), dtype_of(x), dtype_of(y), residual ? dtype_of(*residual) : dt::f32,
                       lane);
  }
  State::Plan& p = *plan;
  std::lock_guard<std::mutex> run_lock(p.mu);
  dnnl::stream& st = stream();
  if (!p.pieces.empty()) {
    s.run_pieces(p, x, *residual, y);
    return;
  }
  bind(p.dst, y);
  if (s.attrs.residual && !in_place) {
    bind(p.residual, *residual);
    execute_reorder(p.copy_residual, st, p.residual, p.dst);
  }
  bind(p.src, x);
  dnnl_memory_t src = p.src.get();
  if (s.precision == Precision::kBF16 && x.dtype() == DType::kF32) {
    bind_conversion_scratch(p.src_bf16, 0);
    execute_reorder(p.to_bf16, st, p.src, p.src_bf16);
    src = p.src_bf16.get();
  }
  const dnnl_exec_arg_t args[] = {{DNNL_ARG_SRC, src},
                                  {DNNL_ARG_WEIGHTS, p.weights.get()},
                                  {DNNL_ARG_DST, p.dst.get()},
                                  {DNNL_ARG_SCRATCHPAD, p.scratchpad.get()},
                                  {DNNL_ARG_BIAS, s.bias ? s.bias.get() : nullptr}};
  execute(p.conv, st, std::span(args, s.bias ? 5 : 4));  // the bias, last, only when there is one
  st.wait();
}

void Conv2d::fold_batch_norm(const Tensor& weight_oihw, const Tensor* bias, const Tensor& gamma, const Tensor& beta,
                             const Tensor& running_mean, const Tensor& running_var, float eps, Tensor* folded_weight,
                             Tensor* folded_bias) {
  bev::fold_batch_norm(weight_oihw, bias, gamma, beta, running_mean, running_var, eps, folded_weight, folded_bias);
}

}  // namespace bev::cpu
