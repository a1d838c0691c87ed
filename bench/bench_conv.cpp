// cpu::Conv2d at BEVFormer's image-stage shapes, f32 and bf16:
//   tiny: ResNet-50, pytorch style (stride on the 3x3), 6 cameras x 3 x 480 x 800
//   base: ResNet-101, caffe style (stride on the first 1x1), 6 cameras x 3 x 928 x 1600
// Per stage: block 0's strided conv, downsample and (where stride 1) 1x1 reduce, then a
// repeated block's 1x1 reduce, 3x3 and 1x1 expand (+ residual + ReLU, the residual added in
// place: y holds the identity, as a planned ResNet does it); for tiny, also the expand with a
// separate residual tensor. Plus the stem, the
// FPN convs and, for base, the DCN offset convs (plain 3x3 convs with 27 outputs).
//
//   bench_conv --benchmark_repetitions=3 --benchmark_min_time=0.2 [--benchmark_filter=tiny]
//
// Each case runs in f32, in bf16 with f32 activations (rounded to bf16 inside every conv), and
// in bf16 with bf16 activations (`bf16act`: input, residual and output bf16, as the ResNet
// keeps them between convs in bf16 precision; not for the stem, whose input is the image).
//
// 1x1 convs that run on our prefetching kernel (those cpu::Direct1x1::supports in f32) also run on
// oneDNN (`f32_onednn`) in the same process, to compare.
//
// Counters: GFLOP/s; pct_peak, the percentage of the peak of the row's own precision, and
// pct_f32_peak, of the f32 peak (the goal is stated against it); both peaks are measured
// in this process (a 2048^3 matmul), so a loaded machine lowers rates and peaks alike.
// BEV_THREADS=n sizes oneDNN's pool (default: all cores).
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "backend/cpu/direct1x1.h"
#include "backend/cpu/conv2d.h"
#include "backend/cpu/conv2d_int8.h"
#include "backend/cpu/onednn.h"
#include "bench_util.h"

namespace {

using bev::DType;
using bev::Shape;
using bev::Tensor;
using bev::cpu::Precision;

using bev::bench::filled;
using bev::bench::peak;

enum class Residual { kNone, kInPlace, kSeparate };

struct ConvCase {
  std::string name;
  int64_t n, h, w, c;  // input NHWC
  int64_t o, k;
  int stride, pad;
  bool relu;
  Residual residual;
};

bev::cpu::Conv2dAttrs attrs_of(const ConvCase& cc) {
  bev::cpu::Conv2dAttrs a;
  a.stride_h = a.stride_w = cc.stride;
  a.pad_h = a.pad_w = cc.pad;
  a.relu = cc.relu;
  a.residual = cc.residual != Residual::kNone;
  return a;
}

// Times `conv` (cpu::Conv2d or cpu::Conv2dInt8) on x with the case's residual into an output of
// `out_dtype`; reports GFLOP/s and % of the f32 peak (and of `p`'s peak when given).
template <typename Conv>
void time_conv(benchmark::State& state, const ConvCase& cc, const Conv& conv, const Tensor& x, DType out_dtype,
               const Precision* p) {
  const Shape out = conv.output_shape(x.shape());
  Tensor y = filled(out, 4).to(out_dtype);
  const Tensor res = cc.residual == Residual::kSeparate ? filled(out, 5).to(out_dtype) : Tensor();
  const Tensor* r = cc.residual == Residual::kSeparate ? &res : cc.residual == Residual::kInPlace ? &y : nullptr;
  conv.run(x, r, y);  // creates the plan for this shape
  state.SetLabel(conv.impl_name(x.shape()));
  for (auto _ : state) {
    conv.run(x, r, y);
    benchmark::DoNotOptimize(y.raw_data());
  }
  const double gflop = conv.flops(x.shape()) * 1e-9;
  state.counters["GFLOP/s"] = benchmark::Counter(gflop, benchmark::Counter::kIsIterationInvariantRate);
  if (p) {
    state.counters["pct_peak"] =
        benchmark::Counter(gflop / peak(*p) * 100.0, benchmark::Counter::kIsIterationInvariantRate);
  }
  state.counters["pct_f32_peak"] =
      benchmark::Counter(gflop / peak(Precision::kF32) * 100.0, benchmark::Counter::kIsIterationInvariantRate);
}

void bm_conv(benchmark::State& state, const ConvCase& cc, Precision p, bool bf16_activations, bool allow_direct = true) {
  const Tensor w = filled({cc.o, cc.c, cc.k, cc.k}, 1);
  const Tensor b = filled({cc.o}, 2);
  const bev::cpu::Conv2d conv(w, &b, attrs_of(cc), p, allow_direct);
  const DType act = bf16_activations ? DType::kBF16 : DType::kF32;
  time_conv(state, cc, conv, filled({cc.n, cc.h, cc.w, cc.c}, 3).to(act), act, &p);
}

// cpu::Conv2dInt8 at the same shape (issue 26): u8 activations (s8 for the stem, which reads the
// image), per-channel s8 weights, f32 output. `int_input`: the input is already integers (the
// conv alone); else f32 quantized inside the run (what a layer after an f32 op pays).
void bm_conv_int8(benchmark::State& state, const ConvCase& cc, bool int_input) {
  const Tensor w = filled({cc.o, cc.c, cc.k, cc.k}, 1);
  const Tensor b = filled({cc.o}, 2);
  const DType act = cc.name.find("stem") != std::string::npos ? DType::kI8 : DType::kU8;
  const bev::cpu::Conv2dInt8 conv(w, &b, attrs_of(cc), act, 1.0f / 127);
  Tensor x = filled({cc.n, cc.h, cc.w, cc.c}, 3);
  if (int_input) {
    Tensor q = Tensor::empty(x.shape(), act);
    conv.quantize(x, q);
    x = q;
  }
  time_conv(state, cc, conv, x, DType::kF32, nullptr);
}

// ResNet bottleneck stages (planes 64, 128, 256, 512; expansion 4) on an image of ih x iw.
std::vector<ConvCase> resnet_cases(const std::string& model, int64_t ih, int64_t iw, bool caffe, bool dcn_offsets) {
  const int64_t n = 6;
  std::vector<ConvCase> cases;
  cases.push_back({model + "/stem_7x7_s2", n, ih, iw, 3, 64, 7, 2, 3, true, Residual::kNone});
  int64_t h = ih / 4, w = iw / 4;  // after the stem and the 3x3/2 max pool
  int64_t in_c = 64;
  for (int stage = 0; stage < 4; ++stage) {
    const int64_t planes = 64LL << stage;
    const int s = stage == 0 ? 1 : 2;
    const int64_t ho = (h - 1) / s + 1, wo = (w - 1) / s + 1;
    const std::string pre = model + "/layer" + std::to_string(stage + 1) + "/";
    if (s == 2) {
      if (caffe) {
        cases.push_back({pre + "b0_reduce_1x1_s2", n, h, w, in_c, planes, 1, 2, 0, true, Residual::kNone});
      } else {
        cases.push_back({pre + "b0_3x3_s2", n, h, w, planes, planes, 3, 2, 1, true, Residual::kNone});
      }
    }
    cases.push_back({pre + "downsample_1x1_s" + std::to_string(s), n, h, w, in_c, 4 * planes, 1, s, 0, false,
                     Residual::kNone});
    // Block 0's conv1 at the stage's input size: in layer1 it reads the stem's 64 channels, not
    // 4 x planes; pytorch style strides the 3x3, so in later stages it runs at stride 1 too.
    if (stage == 0 || !caffe) {
      cases.push_back({pre + "b0_reduce_1x1", n, h, w, in_c, planes, 1, 1, 0, true, Residual::kNone});
    }
    cases.push_back({pre + "reduce_1x1", n, ho, wo, 4 * planes, planes, 1, 1, 0, true, Residual::kNone});
    cases.push_back({pre + "3x3", n, ho, wo, planes, planes, 3, 1, 1, true, Residual::kNone});
    cases.push_back({pre + "expand_1x1_res_inplace", n, ho, wo, planes, 4 * planes, 1, 1, 0, true, Residual::kInPlace});
    if (!caffe) {
      cases.push_back({pre + "expand_1x1_res_separate", n, ho, wo, planes, 4 * planes, 1, 1, 0, true,
                       Residual::kSeparate});
    }
    if (dcn_offsets && stage >= 2) {
      cases.push_back({pre + "dcn_offset_3x3_27", n, ho, wo, planes, 27, 3, 1, 1, false, Residual::kNone});
    }
    h = ho;
    w = wo;
    in_c = 4 * planes;
  }
  return cases;
}

std::vector<ConvCase> all_cases() {
  std::vector<ConvCase> cases = resnet_cases("tiny_r50", 480, 800, false, false);
  // tiny FPN: C5 (2048 @ 15x25) -> lateral 1x1 -> 3x3.
  cases.push_back({"tiny_r50/fpn_lateral_1x1", 6, 15, 25, 2048, 256, 1, 1, 0, false, Residual::kNone});
  cases.push_back({"tiny_r50/fpn_out_3x3", 6, 15, 25, 256, 256, 3, 1, 1, false, Residual::kNone});
  std::vector<ConvCase> base = resnet_cases("base_r101", 928, 1600, true, true);
  cases.insert(cases.end(), base.begin(), base.end());
  // base FPN: C3, C4, C5 laterals, 3x3 outputs and the extra stride-2 level.
  const int64_t hs[] = {116, 58, 29}, ws[] = {200, 100, 50}, cs[] = {512, 1024, 2048};
  for (int l = 0; l < 3; ++l) {
    const std::string lvl = std::to_string(l + 3);
    cases.push_back({"base_r101/fpn_lateral_1x1_C" + lvl, 6, hs[l], ws[l], cs[l], 256, 1, 1, 0, false, Residual::kNone});
    cases.push_back({"base_r101/fpn_out_3x3_P" + lvl, 6, hs[l], ws[l], 256, 256, 3, 1, 1, false, Residual::kNone});
  }
  cases.push_back({"base_r101/fpn_extra_3x3_s2_P6", 6, 29, 50, 256, 256, 3, 2, 1, false, Residual::kNone});
  return cases;
}

}  // namespace

int main(int argc, char** argv) {
  bev::bench::start(&argc, argv);
  for (const ConvCase& c : all_cases()) {
    for (const char* mode : {"f32", "bf16", "bf16act"}) {
      const std::string m = mode;
      if (m == "bf16act" && c.name.find("stem") != std::string::npos) continue;
      const Precision p = m == "f32" ? Precision::kF32 : Precision::kBF16;
      const bool acts = m == "bf16act";
      if (!bev::bench::runs_here(p)) continue;
      benchmark::RegisterBenchmark((c.name + "/" + m).c_str(), [c, p, acts](benchmark::State& s) { bm_conv(s, c, p, acts); })
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
    }
    // int8 at tiny's shapes, where the CPU multiplies int8 exactly: the conv alone, and with its
    // f32 input quantized in the run.
    if (c.name.rfind("tiny_r50", 0) == 0 && bev::cpu::has_int8_dot()) {
      for (const bool int_input : {true, false}) {
        benchmark::RegisterBenchmark((c.name + (int_input ? "/int8act" : "/int8")).c_str(),
                                     [c, int_input](benchmark::State& s) { bm_conv_int8(s, c, int_input); })
            ->Unit(benchmark::kMillisecond)
            ->UseRealTime();
      }
    }
    if (bev::cpu::Direct1x1::supports(attrs_of(c), c.c, c.o, c.k, c.k, Precision::kF32)) {
      benchmark::RegisterBenchmark((c.name + "/f32_onednn").c_str(),
                                   [c](benchmark::State& s) { bm_conv(s, c, Precision::kF32, false, false); })
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
    }
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
