// image_preprocess (the image stage's first op on camera pixels) against a plain reference
// written here in float64 — normalise, then OpenCV's INTER_LINEAR geometry (pixel centres at
// +0.5, edges clamped), then zero padding — on random pixels of awkward sizes, and the shapes Ops
// refuses. (Bit-exactness with upstream is judged on the golden set and the nuScenes frame:
// tests/test_frames.cpp; the full pipeline's dumps: the golden tests.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>

#include "backend/backend.h"
#include "backend/cpu/image_preprocess.h"
#include "backend/ops.h"
#include "bevformer/error.h"
#include "core/thread_pool.h"

namespace bev::cpu {
namespace {

Tensor random_pixels(const Shape& s, uint32_t seed) {
  Tensor t = Tensor::empty(s, DType::kU8);
  std::mt19937 rng(seed);
  uint8_t* p = t.data<uint8_t>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<uint8_t>(rng() & 0xff);
  return t;
}

ImagePreprocessAttrs attrs_for(int64_t h, int64_t w, double scale, bool to_rgb, int64_t divisor) {
  ImagePreprocessAttrs a;
  const double mean[3] = {123.675, 116.28, 103.53}, std_[3] = {58.395, 57.12, 57.375};
  for (int c = 0; c < 3; ++c) {
    a.mean[c] = mean[c];
    a.std[c] = std_[c];
  }
  a.to_rgb = to_rgb;
  a.resized_height = static_cast<int64_t>(static_cast<double>(h) * scale);
  a.resized_width = static_cast<int64_t>(static_cast<double>(w) * scale);
  a.padded_height = (a.resized_height + divisor - 1) / divisor * divisor;
  a.padded_width = (a.resized_width + divisor - 1) / divisor * divisor;
  return a;
}

// One axis of INTER_LINEAR: source index and weight of the second tap for output index d.
std::pair<int64_t, double> linear_tap(int64_t d, int64_t in, int64_t out) {
  const double f = (static_cast<double>(d) + 0.5) * static_cast<double>(in) / static_cast<double>(out) - 0.5;
  int64_t s = static_cast<int64_t>(std::floor(f));
  double w = f - static_cast<double>(s);
  if (s < 0) {
    s = 0;
    w = 0;
  }
  if (s >= in - 1) {
    s = in - 1;
    w = 0;
  }
  return {s, w};
}

Tensor reference(const Tensor& bgr, const ImagePreprocessAttrs& a) {
  const int64_t n = bgr.size(0), h = bgr.size(1), w = bgr.size(2);
  Tensor y = Tensor::zeros({n, a.padded_height, a.padded_width, 3}, DType::kF32);
  const uint8_t* x = bgr.data<uint8_t>();
  float* out = y.data<float>();
  auto norm = [&](int64_t i, int64_t r, int64_t col, int c) {
    const int src_c = a.to_rgb ? 2 - c : c;
    const double v = x[((i * h + r) * w + col) * 3 + src_c];
    return (v - a.mean[c]) / a.std[c];
  };
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t r = 0; r < a.resized_height; ++r) {
      const auto [sy, wy] = linear_tap(r, h, a.resized_height);
      const int64_t sy1 = std::min(sy + 1, h - 1);
      for (int64_t col = 0; col < a.resized_width; ++col) {
        const auto [sx, wx] = linear_tap(col, w, a.resized_width);
        const int64_t sx1 = std::min(sx + 1, w - 1);
        for (int c = 0; c < 3; ++c) {
          const double top = norm(i, sy, sx, c) * (1 - wx) + norm(i, sy, sx1, c) * wx;
          const double bottom = norm(i, sy1, sx, c) * (1 - wx) + norm(i, sy1, sx1, c) * wx;
          out[((i * a.padded_height + r) * a.padded_width + col) * 3 + c] = static_cast<float>(top * (1 - wy) + bottom * wy);
        }
      }
    }
  }
  return y;
}

struct Case {
  int64_t n, h, w;
  double scale;
  bool to_rgb;
  int64_t divisor;
};

TEST(ImagePreprocess, MatchesThePlainReferenceOnAwkwardSizes) {
  const Case cases[] = {
      {1, 33, 47, 1.0, true, 32},   // no resize: normalise and pad only (exact)
      {2, 37, 61, 0.5, false, 32},  // tiny's halving of odd sizes, BGR kept
      {3, 45, 70, 0.8, true, 32},   // small's scale: taps between pixels
      {1, 64, 96, 1.3, true, 32},   // enlarged
      {2, 1, 7, 1.0, true, 1},      // one row, no padding at all
      {1, 40, 40, 0.25, true, 8},   // a quarter: two pixels between taps
  };
  ThreadPool pool(3);
  uint32_t seed = 46;
  for (const Case& c : cases) {
    SCOPED_TRACE(std::to_string(c.n) + "x" + std::to_string(c.h) + "x" + std::to_string(c.w) + " scale " +
                 std::to_string(c.scale));
    const Tensor px = random_pixels({c.n, c.h, c.w, 3}, seed++);
    const ImagePreprocessAttrs a = attrs_for(c.h, c.w, c.scale, c.to_rgb, c.divisor);
    Tensor y = Tensor::empty({c.n, a.padded_height, a.padded_width, 3}, DType::kF32);
    image_preprocess(px, a, y, &pool);
    const Tensor want = reference(px, a);
    const float* got = y.data<float>();
    const float* ref = want.data<float>();
    double worst = 0;
    int64_t padding_nonzero = 0;
    for (int64_t i = 0; i < y.numel(); ++i) {
      worst = std::max(worst, static_cast<double>(std::abs(got[i] - ref[i])));
      padding_nonzero += ref[i] == 0.0f && got[i] != 0.0f;
    }
    // Normalised values are within about +-2.7; float32 arithmetic on them errs by ~1e-6.
    EXPECT_LE(worst, c.scale == 1.0 ? 1e-6 : 2e-5);
    EXPECT_EQ(padding_nonzero, 0);
    // One thread gives the same bits.
    Tensor one = Tensor::empty(y.shape(), DType::kF32);
    image_preprocess(px, a, one, nullptr);
    EXPECT_EQ(0, std::memcmp(one.raw_data(), y.raw_data(), y.nbytes()));
  }
}

TEST(ImagePreprocess, RefusesWhatIsNotPixelsOrSizesThatDoNotFit) {
  const std::unique_ptr<Backend> cpu = make_cpu_backend(1, Precision::kF32);
  Ops ops(*cpu);
  const ImagePreprocessAttrs a = attrs_for(20, 30, 0.5, true, 32);
  const Tensor px = cpu->upload(random_pixels({1, 20, 30, 3}, 1));
  auto refused = [&](const Tensor& x, const ImagePreprocessAttrs& at, const std::string& part) {
    try {
      ops.image_preprocess(x, at, "img");
      ADD_FAILURE() << "accepted; expected an error containing " << part;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput) << e.what();
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  refused(cpu->upload(Tensor::zeros({1, 20, 30, 3}, DType::kF32)), a, "u8 [N, H, W, 3]");
  refused(cpu->upload(random_pixels({1, 20, 30, 4}, 2)), a, "u8 [N, H, W, 3]");
  refused(cpu->upload(random_pixels({20, 30, 3}, 3)), a, "bgr");
  ImagePreprocessAttrs small = a;
  small.padded_width = small.resized_width - 1;
  refused(px, small, "within the padded size");
  ImagePreprocessAttrs zero = a;
  zero.std[1] = 0;
  refused(px, zero, "nonzero");
  // And a sound call runs.
  const Tensor y = ops.image_preprocess(px, a, "img");
  EXPECT_EQ(y.shape(), (Shape{1, 32, 32, 3}));
}

}  // namespace
}  // namespace bev::cpu
