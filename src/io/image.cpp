#include "io/image.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include "bevformer/error.h"
#include "io/byte_source.h"

namespace bev {
namespace {

[[noreturn]] void damaged(const std::string& name, ImageFormat f, const std::string& problem, size_t offset) {
  throw Error(ErrorKind::kInvalidInput, std::string(image_format_name(f)) + " image " + problem)
      .where(name)
      .at_offset(offset)
      .expected(std::string("a complete ") + image_format_name(f) + " file");
}

uint32_t be16(const uint8_t* p) { return (uint32_t{p[0]} << 8) | p[1]; }
uint32_t be32(const uint8_t* p) { return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3]; }

bool is_sof(uint8_t m) { return m >= 0xC0 && m <= 0xCF && m != 0xC4 && m != 0xC8 && m != 0xCC; }

// Walks the JPEG's marker segments (and the entropy-coded data after each SOS) up to EOI.
ImageHeader inspect_jpeg(std::span<const uint8_t> b, const std::string& name) {
  const ImageFormat f = ImageFormat::kJpeg;
  const size_t n = b.size();
  ImageHeader h{f, 0, 0};
  size_t p = 2;
  while (true) {
    if (p >= n) damaged(name, f, "is truncated (no end-of-image marker)", n);
    if (b[p] != 0xFF) damaged(name, f, "is corrupt: a segment does not start with a marker", p);
    while (p < n && b[p] == 0xFF) ++p;  // fill bytes
    if (p >= n) damaged(name, f, "is truncated (no end-of-image marker)", n);
    const uint8_t m = b[p++];
    if (m == 0xD9) break;  // EOI
    if (m == 0x01 || (m >= 0xD0 && m <= 0xD7)) continue;  // standalone markers
    if (m == 0x00 || m == 0xD8) damaged(name, f, "is corrupt: unexpected marker", p - 1);
    if (p + 2 > n) damaged(name, f, "is truncated inside a segment header", n);
    const size_t len = be16(&b[p]);
    if (len < 2) damaged(name, f, "is corrupt: a segment length below 2", p);
    if (p + len > n) damaged(name, f, "is truncated inside a segment", n);
    if (is_sof(m)) {
      if (len < 8) damaged(name, f, "is corrupt: a frame header shorter than 8 bytes", p);
      h.height = static_cast<int>(be16(&b[p + 3]));
      h.width = static_cast<int>(be16(&b[p + 5]));
    }
    p += len;
    if (m == 0xDA) {  // entropy-coded data runs to the next marker that is not a stuffed 0xFF or RST
      while (true) {
        const void* ff = p < n ? std::memchr(&b[p], 0xFF, n - p) : nullptr;
        if (ff == nullptr || static_cast<const uint8_t*>(ff) + 1 >= b.data() + n) {
          damaged(name, f, "is truncated inside the compressed data (no end-of-image marker)", n);
        }
        p = static_cast<size_t>(static_cast<const uint8_t*>(ff) - b.data());
        const uint8_t next = b[p + 1];
        if (next == 0x00 || (next >= 0xD0 && next <= 0xD7)) {
          p += 2;
        } else if (next == 0xFF) {
          p += 1;
        } else {
          break;
        }
      }
    }
  }
  if (h.width <= 0 || h.height <= 0) damaged(name, f, "has no frame header with a size (SOF)", 0);
  return h;
}

// Walks the PNG's chunks up to IEND.
ImageHeader inspect_png(std::span<const uint8_t> b, const std::string& name) {
  const ImageFormat f = ImageFormat::kPng;
  const size_t n = b.size();
  ImageHeader h{f, 0, 0};
  size_t p = 8;
  bool first = true;
  while (true) {
    if (p + 8 > n) damaged(name, f, "is truncated (no IEND chunk)", n);
    const uint32_t len = be32(&b[p]);
    if (len > 0x7fffffffu) damaged(name, f, "is corrupt: a chunk length above 2^31", p);
    if (p + 12 + len > n) damaged(name, f, "is truncated inside a chunk", n);
    const bool ihdr = std::memcmp(&b[p + 4], "IHDR", 4) == 0;
    if (first != ihdr) damaged(name, f, first ? "is corrupt: the first chunk is not IHDR" : "is corrupt: a second IHDR", p);
    if (ihdr) {
      if (len != 13) damaged(name, f, "is corrupt: IHDR is not 13 bytes", p);
      const uint32_t w = be32(&b[p + 8]);
      const uint32_t hh = be32(&b[p + 12]);
      if (w == 0 || hh == 0 || w > 0x7fffffffu || hh > 0x7fffffffu) damaged(name, f, "is corrupt: image size out of range", p + 8);
      h.width = static_cast<int>(w);
      h.height = static_cast<int>(hh);
    }
    first = false;
    const bool iend = std::memcmp(&b[p + 4], "IEND", 4) == 0;
    p += 12 + len;
    if (iend) break;
  }
  return h;
}

}  // namespace

const char* image_format_name(ImageFormat f) { return f == ImageFormat::kPng ? "PNG" : "JPEG"; }

ImageHeader inspect_image(std::span<const uint8_t> bytes, const std::string& name) {
  static constexpr uint8_t kPngSig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  if (bytes.empty()) {
    throw Error(ErrorKind::kInvalidInput, "the image is empty (0 bytes)").where(name).expected("a JPEG or PNG file");
  }
  ImageHeader h;
  if (bytes.size() >= 3 && bytes[0] == 0xFF && bytes[1] == 0xD8 && bytes[2] == 0xFF) {
    h = inspect_jpeg(bytes, name);
  } else if (bytes.size() >= 8 && std::memcmp(bytes.data(), kPngSig, 8) == 0) {
    h = inspect_png(bytes, name);
  } else {
    throw Error(ErrorKind::kInvalidInput, "not a JPEG or PNG image (unknown signature)")
        .where(name)
        .expected("a JPEG (FF D8 FF) or PNG (89 'PNG') file");
  }
  if (int64_t{h.width} * h.height > kMaxImagePixels) {
    throw Error(ErrorKind::kUnsupported, std::string(image_format_name(h.format)) + " image is " +
                                             std::to_string(h.width) + "x" + std::to_string(h.height))
        .where(name)
        .expected("at most " + std::to_string(kMaxImagePixels) + " pixels");
  }
  return h;
}

namespace {

// Decodes into `t` (checked by the caller against the header `h`).
void decode_checked(std::span<const uint8_t> bytes, const ImageHeader& h, const std::string& name, const Tensor& t) {
  verify_image_data(bytes, h, name);
  if (bytes.size() > static_cast<size_t>(INT_MAX)) {
    throw Error(ErrorKind::kUnsupported, "the image file is larger than 2 GiB").where(name);
  }
  const cv::Mat buf(1, static_cast<int>(bytes.size()), CV_8UC1, const_cast<uint8_t*>(bytes.data()));
  // Decoded straight into the tensor: imdecode keeps a destination of the right size and type,
  // so the pixels exist once (a frame of large images would otherwise hold them twice).
  cv::Mat img(h.height, h.width, CV_8UC3, t.raw_data());
  try {
    cv::imdecode(buf, cv::IMREAD_COLOR | cv::IMREAD_IGNORE_ORIENTATION, &img);
  } catch (const cv::Exception& e) {
    throw Error(ErrorKind::kInvalidInput, std::string(image_format_name(h.format)) + " image cannot be decoded: " + e.what())
        .where(name);
  }
  if (img.empty()) {
    throw Error(ErrorKind::kInvalidInput, std::string(image_format_name(h.format)) + " image cannot be decoded (corrupt data)")
        .where(name)
        .expected(std::string("a valid ") + image_format_name(h.format) + " file");
  }
  if (img.type() != CV_8UC3 || img.cols != h.width || img.rows != h.height || img.data != t.raw_data()) {
    throw Error(ErrorKind::kInternal, "OpenCV decoded a " + std::to_string(img.cols) + "x" + std::to_string(img.rows) +
                                          " image of type " + std::to_string(img.type()) + " from a " +
                                          std::to_string(h.width) + "x" + std::to_string(h.height) + " header" +
                                          (img.data != t.raw_data() ? " into its own buffer" : ""))
        .where(name);
  }
}

}  // namespace

Tensor decode_image(std::span<const uint8_t> bytes, const std::string& name) {
  const ImageHeader h = inspect_image(bytes, name);
  Tensor t = Tensor::empty({h.height, h.width, 3}, DType::kU8);
  decode_checked(bytes, h, name, t);
  return t;
}

void decode_image_into(std::span<const uint8_t> bytes, const std::string& name, const Tensor& t) {
  const ImageHeader h = inspect_image(bytes, name);
  if (t.dtype() != DType::kU8 || t.device() != Device::kCpu || !t.is_contiguous() || t.shape() != Shape{h.height, h.width, 3}) {
    throw Error(ErrorKind::kInternal, "cannot decode a " + std::to_string(h.width) + "x" + std::to_string(h.height) +
                                          " image into " + t.describe())
        .where(name)
        .expected("a contiguous host u8 tensor of the image's size");
  }
  decode_checked(bytes, h, name, t);
}

Tensor read_image(const std::string& path) {
  const auto src = ByteSource::map_file(path, kMaxImageFileBytes);
  return decode_image(src->span(), path);
}

std::vector<uint8_t> read_file_bytes(const std::string& path) {
  const auto src = ByteSource::map_file(path, kMaxImageFileBytes);
  return {src->data(), src->data() + src->size()};
}

std::vector<uint8_t> encode_image(const Tensor& bgr, const std::string& ext) {
  bgr.check_dtype(DType::kU8);
  if (bgr.dim() != 3 || bgr.size(2) != 3) {
    throw Error(ErrorKind::kInvalidInput, "cannot encode " + bgr.describe()).expected("u8 [H, W, 3] (BGR)");
  }
  const Tensor c = bgr.contiguous();
  const cv::Mat m(static_cast<int>(c.size(0)), static_cast<int>(c.size(1)), CV_8UC3, c.raw_data());
  std::vector<uint8_t> out;
  std::vector<int> params;
  if (ext == ".jpg" || ext == ".jpeg") params = {cv::IMWRITE_JPEG_QUALITY, 95};
  try {
    if (!cv::imencode(ext, m, out, params)) throw Error(ErrorKind::kInternal, "OpenCV could not encode the image as " + ext);
  } catch (const cv::Exception& e) {
    throw Error(ErrorKind::kInvalidInput, "cannot encode an image as '" + ext + "': " + e.what()).expected("\".png\" or \".jpg\"");
  }
  return out;
}

}  // namespace bev
