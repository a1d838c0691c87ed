#include "backend/cpu/image_preprocess.h"

#include <algorithm>
#include <cstring>

#include <opencv2/core.hpp>
#include <opencv2/imgproc.hpp>

#include "backend/cpu/kernel_check.h"

namespace bev::cpu {
namespace {

// One camera: u8 [H, W, 3] at `src` -> f32 [padded_height, padded_width, 3] at `out`.
void preprocess_one(const uint8_t* src, int64_t h, int64_t w, const ImagePreprocessAttrs& a, float* out) {
  // The constructor does not copy; OpenCV only reads it.
  const cv::Mat u8(static_cast<int>(h), static_cast<int>(w), CV_8UC3, const_cast<uint8_t*>(src));
  // mmcv.imnormalize_: img.astype(np.float32); cv2.cvtColor(img, cv2.COLOR_BGR2RGB, img);
  // cv2.subtract(img, mean, img); cv2.multiply(img, stdinv, img) with mean and stdinv float64.
  cv::Mat f;
  u8.convertTo(f, CV_32F);
  if (a.to_rgb) cv::cvtColor(f, f, cv::COLOR_BGR2RGB);
  cv::subtract(f, cv::Scalar(a.mean[0], a.mean[1], a.mean[2]), f);
  cv::multiply(f, cv::Scalar(1 / a.std[0], 1 / a.std[1], 1 / a.std[2]), f);
  if (a.resized_width != w || a.resized_height != h) {  // mmcv.imresize: cv2.resize(img, size, INTER_LINEAR)
    cv::Mat r;
    cv::resize(f, r, cv::Size(static_cast<int>(a.resized_width), static_cast<int>(a.resized_height)), 0, 0,
               cv::INTER_LINEAR);
    f = r;
  }
  // OpenCV's interleaved rows are already HWC: each becomes the start of a padded row, the rest 0.
  const size_t row_floats = 3 * static_cast<size_t>(a.padded_width);
  std::fill(out, out + row_floats * static_cast<size_t>(a.padded_height), 0.0f);
  for (int y = 0; y < f.rows; ++y) {
    std::memcpy(out + static_cast<size_t>(y) * row_floats, f.ptr<float>(y), sizeof(float) * 3 * static_cast<size_t>(f.cols));
  }
}

}  // namespace

void image_preprocess(const Tensor& bgr, const ImagePreprocessAttrs& a, Tensor& y, ThreadPool* pool) {
  const char* op = "image_preprocess";
  if (!bgr.defined() || bgr.dtype() != DType::kU8 || bgr.device() != Device::kCpu || bgr.dim() != 4 ||
      bgr.size(3) != 3 || !bgr.is_contiguous()) {
    bad_tensor(op, bgr, "input bgr", "contiguous host u8 [N, H, W, 3]");
  }
  if (a.resized_height <= 0 || a.resized_width <= 0 || a.padded_height < a.resized_height ||
      a.padded_width < a.resized_width) {
    bad_tensor(op, y, "output (resized " + std::to_string(a.resized_width) + "x" + std::to_string(a.resized_height) + ")",
               "a positive resized size within the padded size");
  }
  const int64_t n = bgr.size(0), h = bgr.size(1), w = bgr.size(2);
  expect_f32_shape(op, y, "output", {n, a.padded_height, a.padded_width, 3});
  const size_t in_per = static_cast<size_t>(h * w * 3);
  const size_t out_per = static_cast<size_t>(a.padded_height * a.padded_width * 3);
  const uint8_t* src = bgr.data<uint8_t>();
  float* dst = y.data<float>();
  for_chunks(pool, n, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) preprocess_one(src + static_cast<size_t>(i) * in_per, h, w, a, dst + static_cast<size_t>(i) * out_per);
  });
}

}  // namespace bev::cpu
