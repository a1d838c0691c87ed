// Camera images: JPEG and PNG decoded with OpenCV exactly as upstream's mmcv.imread does
// (libjpeg-turbo / libpng through cv::imdecode, BGR channel order), into u8 [H, W, 3] tensors.
// Damaged input is refused, never decoded into made-up pixels: libjpeg fills a truncated JPEG
// with grey and only warns, so the byte stream's structure is walked first (JPEG markers up to
// EOI, PNG chunks up to IEND) and then its compressed data is decoded once without keeping the
// pixels, with libjpeg's corrupt-data warnings as errors and every PNG CRC and the IDAT stream's
// size checked (image_verify.cpp). Images larger than kMaxImagePixels are refused from the
// header, before any allocation.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace bev {

constexpr int64_t kMaxImagePixels = int64_t{1} << 26;  // 64 Mpixel (8192 x 8192)

enum class ImageFormat : uint8_t { kJpeg, kPng };
const char* image_format_name(ImageFormat f);  // "JPEG" | "PNG"

struct ImageHeader {
  ImageFormat format = ImageFormat::kJpeg;
  int width = 0;
  int height = 0;
};

// Reads the format and size from the header and checks that the stream is complete (every JPEG
// segment up to EOI, every PNG chunk up to IEND, inside the bytes). Error(kInvalidInput) names
// `name` (a file path or "cameras[2].image") for anything else: empty, not JPEG/PNG, truncated.
// Over kMaxImagePixels is Error(kUnsupported) (too large, not malformed).
ImageHeader inspect_image(std::span<const uint8_t> bytes, const std::string& name);

// Decodes the compressed data of an image that inspect_image accepted (`h` is its answer) without
// keeping the pixels (memory: about one row): Error(kInvalidInput) when any of it is missing or
// corrupt — what the structural walk cannot see (a JPEG scan cut short and closed with EOI, a PNG
// chunk whose CRC fails or whose IDAT stream does not inflate to exactly its image's size).
void verify_image_data(std::span<const uint8_t> bytes, const ImageHeader& h, const std::string& name);

// The largest image file read_image reads (a bound on what a path can make the reader hold).
constexpr uint64_t kMaxImageFileBytes = uint64_t{512} << 20;

// Decodes to u8 [H, W, 3], BGR (cv::IMREAD_COLOR: grey becomes 3 channels, alpha is dropped,
// 16-bit is scaled to 8-bit; EXIF orientation is ignored, as calibration refers to the sensor's
// pixels). Errors name `name`.
Tensor decode_image(std::span<const uint8_t> bytes, const std::string& name);
// The same into `out`, a contiguous host u8 [H, W, 3] of the image's size (a frame's block of
// cameras, in a backend's staging memory): the pixels are written once, where they go next.
void decode_image_into(std::span<const uint8_t> bytes, const std::string& name, const Tensor& out);
// Reads a regular file of at most kMaxImageFileBytes (byte_source.h: a FIFO or device is refused,
// never waited on): kNotFound when it does not exist, kIo when it cannot be read, else decode_image.
Tensor read_image(const std::string& path);
std::vector<uint8_t> read_file_bytes(const std::string& path);

// Encodes a u8 [H, W, 3] BGR tensor; `ext` is ".png" or ".jpg" (quality 95).
std::vector<uint8_t> encode_image(const Tensor& bgr, const std::string& ext);

}  // namespace bev
