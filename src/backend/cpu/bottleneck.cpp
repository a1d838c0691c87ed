#include "backend/cpu/bottleneck.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <exception>
#include <string>

#include "backend/cpu/amx1x1.h"
#include "backend/cpu/onednn.h"
#include "bevformer/error.h"

namespace bev::cpu {
namespace {

[[noreturn]] void invalid(const std::string& problem, const std::string& expected) {
  throw Error(ErrorKind::kInvalidInput, problem).where("cpu::Bottleneck").expected(expected);
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Rows [r0, r1) of image n of an NHWC tensor: a contiguous [1, r1 - r0, W, C] view.
Tensor rows(const Tensor& t, int64_t n, int64_t r0, int64_t r1) { return t.slice(0, n, n + 1).slice(1, r0, r1); }

void zero(const Tensor& t) { std::memset(t.raw_data(), 0, t.nbytes()); }

void copy(const Tensor& from, const Tensor& to) { std::memcpy(to.raw_data(), from.raw_data(), to.nbytes()); }

void prefetch(const Tensor& t) {
  const char* p = static_cast<const char*>(t.raw_data());
  for (size_t off = 0; off < t.nbytes(); off += 64) _mm_prefetch(p + off, _MM_HINT_T0);
}

enum Member { kConv1, kConv2, kConv3, kDownsample, kHalo, kMembers };

// Rows per strip for a map of width w.
int64_t strip_rows(size_t budget, int64_t h, int64_t w, int64_t in_ch, int64_t planes, int64_t out_ch, size_t xs, size_t as,
                   size_t ys) {
  const size_t row_bytes = static_cast<size_t>(w) * (static_cast<size_t>(in_ch) * xs + 2 * static_cast<size_t>(planes) * as +
                                                     static_cast<size_t>(out_ch) * (ys + 4));
  return std::clamp<int64_t>(static_cast<int64_t>(budget / row_bytes), 1, h);
}

// A buffer that only grows, and this run's view of it: maps of several sizes (camera rigs with
// plans of their own) take turns without allocating again.
struct Workspace {
  Tensor buffer, view;
  void ensure(const Shape& shape, DType dtype) {
    const int64_t need = shape_numel(shape);
    if (!buffer.defined() || buffer.dtype() != dtype || buffer.numel() < need) buffer = Tensor::empty({need}, dtype);
    view = buffer.slice(0, 0, need).reshape(shape);
  }
};

}  // namespace

struct Bottleneck::State {
  std::shared_ptr<const Conv2d> conv1, conv2, conv3, downsample;
  Conv2d conv2_strip;  // conv2's weights, padded left and right only: strips carry their own halo rows
  int64_t in_ch = 0, planes = 0, out_ch = 0;
  size_t strip_bytes = Bottleneck::kStripBytes;

  // Per run: one caller at a time (the workspaces are shared by the calls).
  mutable std::mutex mu;
  // Per thread: conv1's output for a strip and its two halo rows, conv2's output for a strip.
  // Grown on the first run of a shape and then reused, so replays allocate nothing here.
  mutable std::vector<Workspace> t1, t2;
  mutable Workspace halo;  // [bands * 2, 1, W, P]: conv1's output just above and below each band
  mutable double member_seconds[kMembers] = {};
  mutable int threads = 0;

  State(std::shared_ptr<const Conv2d> c1, std::shared_ptr<const Conv2d> c2, std::shared_ptr<const Conv2d> c3,
        std::shared_ptr<const Conv2d> ds)
      : conv1(std::move(c1)),
        conv2(std::move(c2)),
        conv3(std::move(c3)),
        downsample(std::move(ds)),
        conv2_strip(conv2->with_attrs([&] {
          Conv2dAttrs a = conv2->attrs();
          a.pad_h = 0;
          return a;
        }())) {}

};

Bottleneck::Bottleneck(std::shared_ptr<const Conv2d> conv1, std::shared_ptr<const Conv2d> conv2,
                       std::shared_ptr<const Conv2d> conv3, std::shared_ptr<const Conv2d> downsample,
                       size_t strip_bytes) {
  if (!conv1 || !conv2 || !conv3) invalid("a member conv is missing", "conv1, conv2 and conv3");
  if (!bottleneck_attrs_fusable(conv1->attrs(), conv2->attrs(), conv3->attrs(),
                                downsample ? &downsample->attrs() : nullptr)) {
    invalid("convs that are not a stride-1 bottleneck", "1x1 + ReLU, 3x3 pad 1 + ReLU, 1x1 + residual + ReLU");
  }
  if (conv1->precision() != conv3->precision() || conv2->precision() != conv3->precision() ||
      (downsample && downsample->precision() != conv3->precision())) {
    invalid("members of different precisions", "one precision");
  }
  state_ = std::make_unique<State>(std::move(conv1), std::move(conv2), std::move(conv3), std::move(downsample));
  State& s = *state_;
  s.strip_bytes = std::max<size_t>(strip_bytes, 1);
  s.in_ch = s.conv1->in_channels();
  s.planes = s.conv1->out_channels();
  s.out_ch = s.conv3->out_channels();
  if (s.conv2->in_channels() != s.planes || s.conv3->in_channels() != s.conv2->out_channels()) {
    invalid("conv1 -> conv2 -> conv3 channels do not chain", "conv2 and conv3 to read their predecessor's output");
  }
  if (s.downsample && (s.downsample->in_channels() != s.in_ch || s.downsample->out_channels() != s.out_ch)) {
    invalid("the downsample does not map the input to conv3's channels", "[C] -> [E] like conv1 -> conv3");
  }
  if (!s.downsample && s.in_ch != s.out_ch) {
    invalid("no downsample, but " + std::to_string(s.in_ch) + " input and " + std::to_string(s.out_ch) +
                " output channels",
            "a downsample, or as many output channels as input channels");
  }
}

Bottleneck::~Bottleneck() = default;

bool Bottleneck::pays(const Shape& x, int64_t planes, int64_t out_ch, DType act) {
  if (x.size() != 4) return false;
  if (act == DType::kBF16 && isa_has_amx()) {  // only with its 1x1s on cpu::Amx1x1 (see pays's comment)
    const Conv2dAttrs one;
    const auto amx = [&](int64_t k, int64_t o) { return Amx1x1::supports(one, k, o, 1, 1, Precision::kBF16); };
    if (!amx(x[3], planes) || !amx(planes, out_ch) || (x[3] != out_ch && !amx(x[3], out_ch))) return false;
    if (x[1] * x[2] * out_ch * static_cast<int64_t>(dtype_size(act)) < kAmxMinImageBytes) return false;
  }
  // x and y: in bf16 precision mostly bf16 like t1 and t2; in int8 f32 (only t1, t2 are u8 codes).
  const size_t as = dtype_size(act), io = act == DType::kU8 ? dtype_size(DType::kF32) : as;
  return strip_rows(kStripBytes, x[1], x[2], x[3], planes, out_ch, io, as, io) * x[2] >= kMinStripPixels;
}

Shape Bottleneck::output_shape(const Shape& in) const {
  const State& s = *state_;
  if (in.size() != 4 || in[3] != s.in_ch || in[0] < 1 || in[1] < 1 || in[2] < 1) {
    invalid("input shape " + shape_str(in), "NHWC with " + std::to_string(s.in_ch) + " channels");
  }
  return {in[0], in[1], in[2], s.out_ch};
}

std::vector<double> Bottleneck::last_member_seconds() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return std::vector<double>(state_->member_seconds, state_->member_seconds + kMembers);
}

int Bottleneck::last_threads() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->threads;
}

void Bottleneck::run(const Tensor& x, Tensor& y, DType act) const {
  const State& s = *state_;
  const Shape out = output_shape(x.shape());
  if (!x.is_contiguous() || !y.defined() || !y.is_contiguous() || y.shape() != out) {
    invalid("input " + x.describe() + ", output " + (y.defined() ? y.describe() : std::string("undefined")),
            "contiguous tensors, the output of shape " + shape_str(out));
  }
  const bool in_place = x.raw_data() == y.raw_data();
  if (in_place && (s.downsample || x.dtype() != y.dtype())) {
    invalid("the output is the input itself", "a separate output when there is a downsample or the dtypes differ");
  }
  if (!in_place && overlaps(x, y)) invalid("output " + y.describe() + " overlaps input " + x.describe(), "disjoint tensors");

  const int64_t n_img = x.size(0), h = x.size(1), w = x.size(2);
  const int64_t p = s.planes;
  const size_t as = dtype_size(act), xs = dtype_size(x.dtype()), ys = dtype_size(y.dtype());
  const int64_t strip = strip_rows(s.strip_bytes, h, w, s.in_ch, p, s.out_ch, xs, as, ys);

  // Bands: whole images when they divide evenly among the threads, else images cut into k bands.
  const int team = std::max(1, num_threads());
  int64_t k = 1;
  while ((n_img * k) % team != 0 && k < h && n_img * k < 8 * team) ++k;
  const int64_t bands = n_img * k;
  const int threads = static_cast<int>(std::min<int64_t>(team, bands));
  auto band_of = [&](int64_t b, int64_t* n, int64_t* r0, int64_t* r1) {
    *n = b / k;
    *r0 = h * (b % k) / k;
    *r1 = h * (b % k + 1) / k;
  };

  // bf16 on AMX: the 1x1 members run on cpu::Amx1x1 (Conv2d::amx1x1), which takes the next strip's
  // rows of x as its spread: they arrive while conv3 computes, where a burst of prefetches before
  // the strip stalled the core until memory delivered them.
  // The kernels are asked for once, here: Conv2d::amx1x1() locks the conv (it packs on first use).
  const bool bf16_in = act == DType::kBF16 && x.dtype() == DType::kBF16;
  const Amx1x1* amx1 = bf16_in ? s.conv1->amx1x1() : nullptr;
  const Amx1x1* amx3 = bf16_in ? s.conv3->amx1x1() : nullptr;
  const Amx1x1* amx_ds = bf16_in && s.downsample ? s.downsample->amx1x1() : nullptr;
  const bool amx = amx1 && amx3 && (!s.downsample || amx_ds);
  const Conv2d* convs[kMembers] = {s.conv1.get(), nullptr, s.conv3.get(), s.downsample.get(), nullptr};
  const Amx1x1* kernels[kMembers] = {amx1, nullptr, amx3, amx_ds, nullptr};
  auto run_1x1 = [&](Member m, const Tensor& in, const Tensor* residual, Tensor& dst, int lane,
                     const Tensor* spread = nullptr) {
    if (!amx) {
      convs[m]->run(in, residual, dst, lane);
      return;
    }
    kernels[m]->run(static_cast<const uint16_t*>(in.raw_data()), residual ? residual->raw_data() : nullptr,
                    residual ? residual->dtype() : DType::kF32, dst.raw_data(), dst.dtype(), in.numel() / in.size(3),
                    spread ? spread->raw_data() : nullptr, spread ? spread->nbytes() : 0);
  };

  std::lock_guard<std::mutex> lock(s.mu);
  if (static_cast<int>(s.t1.size()) < threads) {
    s.t1.resize(static_cast<size_t>(threads));
    s.t2.resize(static_cast<size_t>(threads));
  }
  for (int t = 0; t < threads; ++t) {
    s.t1[static_cast<size_t>(t)].ensure({1, strip + 2, w, p}, act);
    s.t2[static_cast<size_t>(t)].ensure({1, strip, w, p}, act);
  }
  s.halo.ensure({bands * 2, 1, w, p}, act);
  const Tensor& halo = s.halo.view;
  std::fill(std::begin(s.member_seconds), std::end(s.member_seconds), 0.0);

  std::exception_ptr error;
  std::atomic<bool> failed{false};
#pragma omp parallel num_threads(threads)
  {
    // The team OpenMP gave, which may be smaller than asked (called from inside another parallel
    // region, OMP_THREAD_LIMIT, dynamic teams): every band must still be run.
    const int t = omp_get_thread_num(), team_now = omp_get_num_threads();
    const int64_t b0 = bands * t / team_now, b1 = bands * (t + 1) / team_now;
    double secs[kMembers] = {};
    auto timed = [&](Member m, auto&& fn) {
      const auto t0 = std::chrono::steady_clock::now();
      fn();
      secs[m] += seconds_since(t0);
    };
    // Phase 1: conv1's output on the rows just outside each band, before any thread writes y
    // (which may be x).
    try {
      for (int64_t b = b0; b < b1; ++b) {
        int64_t n, r0, r1;
        band_of(b, &n, &r0, &r1);
        Tensor above = halo.slice(0, 2 * b, 2 * b + 1), below = halo.slice(0, 2 * b + 1, 2 * b + 2);
        timed(kHalo, [&] {
          if (r0 > 0) run_1x1(kConv1, rows(x, n, r0 - 1, r0), nullptr, above, t);
          if (r1 < h) run_1x1(kConv1, rows(x, n, r1, r1 + 1), nullptr, below, t);
        });
      }
    } catch (...) {
#pragma omp critical(bev_bottleneck_error)
      if (!error) error = std::current_exception();
      failed = true;
    }
#pragma omp barrier
    // Phase 2: strips. t1 row i holds conv1's output for image row h0 - 1 + i.
    try {
      const Tensor& t1 = s.t1[static_cast<size_t>(t)].view;
      const Tensor& t2 = s.t2[static_cast<size_t>(t)].view;
      const size_t t1_row = static_cast<size_t>(w * p) * as;
      for (int64_t b = b0; b < b1 && !failed; ++b) {
        int64_t n, r0, r1;
        band_of(b, &n, &r0, &r1);
        if (r0 == 0) {
          zero(t1.slice(1, 0, 1));
        } else {
          copy(halo.slice(0, 2 * b, 2 * b + 1), t1.slice(1, 0, 1));
        }
        timed(kConv1, [&] {
          Tensor first = t1.slice(1, 1, 2);
          run_1x1(kConv1, rows(x, n, r0, r0 + 1), nullptr, first, t);
        });
        for (int64_t h0 = r0; h0 < r1;) {
          const int64_t h1 = std::min(h0 + strip, r1), m = h1 - h0;
          const int64_t fresh = std::min(h1, r1 - 1) - h0;  // rows h0+1 .. of conv1 from x
          // conv1 of the next strip reads rows that are not in any cache: a single 200 KB stream
          // per core, on which the hardware prefetcher keeps too few lines in flight (oneDNN's
          // conv1 alone, in strips: 63% of the peak; with this: 95%). Asked for now, they arrive
          // while this strip's convs compute. Counted in conv1's time. A conv1 on cpu::Direct1x1
          // (f32) prefetches its own input as it goes; the burst is then redundant, and measured
          // within noise of leaving it out (tiny layer1 block 0: 61.0 / 62.0 against 61.2 / 63.6 ms).
          // On AMX the burst stalls the core for as long as memory takes to deliver it; conv3's
          // Amx1x1 asks for the same rows a few at a time instead (its spread, below, counted in
          // conv3's time).
          const Tensor next = h1 < r1 - 1 ? rows(x, n, h1 + 1, std::min(h1 + strip, r1 - 1) + 1) : Tensor();
          if (next.defined() && !amx) timed(kConv1, [&] { prefetch(next); });
          if (fresh > 0) {
            timed(kConv1, [&] {
              Tensor dst = t1.slice(1, 2, 2 + fresh);
              run_1x1(kConv1, rows(x, n, h0 + 1, h0 + 1 + fresh), nullptr, dst, t);
            });
          }
          if (h1 == r1) {  // the row below the band: zero padding, or the halo from phase 1
            Tensor last = t1.slice(1, m + 1, m + 2);
            if (r1 == h) {
              zero(last);
            } else {
              copy(halo.slice(0, 2 * b + 1, 2 * b + 2), last);
            }
          }
          Tensor mid = t2.slice(1, 0, m);
          timed(kConv2, [&] { s.conv2_strip.run(t1.slice(1, 0, m + 2), nullptr, mid, t); });
          Tensor y_rows = rows(y, n, h0, h1);
          if (s.downsample) {
            timed(kDownsample, [&] { run_1x1(kDownsample, rows(x, n, h0, h1), nullptr, y_rows, t); });
          }
          timed(kConv3, [&] {
            const Tensor* spread = amx && next.defined() ? &next : nullptr;
            if (s.downsample || in_place) {
              run_1x1(kConv3, mid, &y_rows, y_rows, t, spread);
            } else {
              const Tensor x_rows = rows(x, n, h0, h1);
              run_1x1(kConv3, mid, &x_rows, y_rows, t, spread);
            }
          });
          // The next strip's first two rows of t1 are this strip's last two.
          std::memmove(t1.raw_data(), static_cast<char*>(t1.raw_data()) + static_cast<size_t>(m) * t1_row, 2 * t1_row);
          h0 = h1;
        }
      }
    } catch (...) {
#pragma omp critical(bev_bottleneck_error)
      if (!error) error = std::current_exception();
      failed = true;
    }
#pragma omp critical(bev_bottleneck_times)
    {
      for (int m = 0; m < kMembers; ++m) s.member_seconds[m] += secs[m];
      s.threads = team_now;
    }
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace bev::cpu
