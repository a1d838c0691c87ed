// The compressed data of an image, checked by decoding it without keeping the pixels: a JPEG
// through libjpeg one row at a time with its corrupt-data warnings made errors (libjpeg, and so
// OpenCV, fills a truncated scan with grey and carries on), a PNG by checking every chunk's CRC
// and inflating its IDAT stream to exactly the bytes its header implies. Memory: one row.
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <vector>

#include <jpeglib.h>
// after jpeglib.h: the message codes (JWRN_*)
#include <jerror.h>
#include <zlib.h>

#include "bevformer/error.h"
#include "io/image.h"

namespace bev {
namespace {

[[noreturn]] void corrupt(const std::string& name, ImageFormat f, const std::string& problem) {
  throw Error(ErrorKind::kInvalidInput, std::string(image_format_name(f)) + " image data is corrupt: " + problem)
      .where(name)
      .expected(std::string("a complete, valid ") + image_format_name(f) + " file");
}

// ---- JPEG

struct JpegErrors {
  jpeg_error_mgr mgr;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

[[noreturn]] void jpeg_fail(j_common_ptr c) {
  auto* e = reinterpret_cast<JpegErrors*>(c->err);
  (*c->err->format_message)(c, e->message);
  std::longjmp(e->jump, 1);
}

// Warnings that mean pixels were invented (missing or undecodable data) fail; the others
// (extraneous bytes between segments, odd JFIF versions, ...) leave the image as encoded.
void jpeg_message(j_common_ptr c, int level) {
  if (level != -1) return;
  switch (c->err->msg_code) {
    case JWRN_HIT_MARKER:
    case JWRN_JPEG_EOF:
    case JWRN_HUFF_BAD_CODE:
    case JWRN_MUST_RESYNC:
    case JWRN_NOT_SEQUENTIAL:
    case JWRN_BOGUS_PROGRESSION:
    case JWRN_ARITH_BAD_CODE: jpeg_fail(c);
    default: return;
  }
}

// True when every scanline decodes cleanly; else false with libjpeg's message. Only C objects
// live in this frame, as longjmp skips destructors.
bool jpeg_decodes(const uint8_t* data, size_t size, char* message) {
  jpeg_decompress_struct cinfo;
  JpegErrors err;
  cinfo.err = jpeg_std_error(&err.mgr);
  err.mgr.error_exit = jpeg_fail;
  err.mgr.emit_message = jpeg_message;
  if (setjmp(err.jump)) {
    jpeg_destroy_decompress(&cinfo);
    std::memcpy(message, err.message, JMSG_LENGTH_MAX);
    return false;
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, data, static_cast<unsigned long>(size));
  jpeg_read_header(&cinfo, TRUE);
  // Every entropy-coded bit is still decoded; only the work on pixels that nobody keeps is cut.
  cinfo.dct_method = JDCT_IFAST;
  cinfo.do_fancy_upsampling = FALSE;
  if (cinfo.jpeg_color_space == JCS_YCbCr || cinfo.jpeg_color_space == JCS_GRAYSCALE) cinfo.out_color_space = JCS_GRAYSCALE;
  jpeg_start_decompress(&cinfo);
  JSAMPARRAY rows = (*cinfo.mem->alloc_sarray)(reinterpret_cast<j_common_ptr>(&cinfo), JPOOL_IMAGE,
                                               cinfo.output_width * static_cast<JDIMENSION>(cinfo.output_components),
                                               static_cast<JDIMENSION>(cinfo.rec_outbuf_height));
  while (cinfo.output_scanline < cinfo.output_height) {
    jpeg_read_scanlines(&cinfo, rows, static_cast<JDIMENSION>(cinfo.rec_outbuf_height));
  }
  jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  return true;
}

// ---- PNG

uint32_t be32(const uint8_t* p) { return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3]; }

// Rows of the filtered image data, per Adam7 pass or one pass: {count, bytes per row + filter byte}.
std::vector<std::pair<uint64_t, uint64_t>> png_rows(uint64_t w, uint64_t h, uint64_t bits_per_pixel, bool interlaced) {
  auto row_bytes = [&](uint64_t width) { return 1 + (width * bits_per_pixel + 7) / 8; };
  if (!interlaced) return {{h, row_bytes(w)}};
  static constexpr int kPass[7][4] = {{0, 0, 8, 8}, {4, 0, 8, 8}, {0, 4, 4, 8}, {2, 0, 4, 4}, {0, 2, 2, 4}, {1, 0, 2, 2}, {0, 1, 1, 2}};
  std::vector<std::pair<uint64_t, uint64_t>> out;
  for (const auto& p : kPass) {
    const uint64_t pw = w > uint64_t(p[0]) ? (w - p[0] + p[2] - 1) / p[2] : 0;
    const uint64_t ph = h > uint64_t(p[1]) ? (h - p[1] + p[3] - 1) / p[3] : 0;
    if (pw > 0 && ph > 0) out.emplace_back(ph, row_bytes(pw));
  }
  return out;
}

void verify_png(std::span<const uint8_t> b, const std::string& name) {
  const ImageFormat f = ImageFormat::kPng;
  // inspect_image walked the chunks already: every one lies inside the bytes, IHDR first.
  const uint8_t* ihdr = &b[16];
  const uint32_t w = be32(ihdr), h = be32(ihdr + 4);
  const int depth = ihdr[8], color = ihdr[9];
  int channels = 0;
  switch (color) {
    case 0: channels = (depth == 1 || depth == 2 || depth == 4 || depth == 8 || depth == 16) ? 1 : 0; break;
    case 3: channels = (depth == 1 || depth == 2 || depth == 4 || depth == 8) ? 1 : 0; break;
    case 2: case 4: case 6:
      channels = (depth == 8 || depth == 16) ? (color == 2 ? 3 : color == 4 ? 2 : 4) : 0;
      break;
    default: break;
  }
  if (channels == 0) corrupt(name, f, "IHDR has color type " + std::to_string(color) + " with bit depth " + std::to_string(depth));
  if (ihdr[10] != 0 || ihdr[11] != 0 || ihdr[12] > 1) corrupt(name, f, "IHDR names an unknown compression, filter or interlace method");
  const auto rows = png_rows(w, h, static_cast<uint64_t>(channels) * static_cast<uint64_t>(depth), ihdr[12] == 1);

  z_stream z{};
  if (inflateInit(&z) != Z_OK) throw Error(ErrorKind::kInternal, "zlib inflateInit failed").where(name);
  struct End {
    z_stream* z;
    ~End() { inflateEnd(z); }
  } end{&z};
  std::vector<uint8_t> chunk_out(64 * 1024);
  size_t pass = 0;
  uint64_t row = 0, at_in_row = 0;  // position in the filtered data: pass, row of it, byte of the row
  bool stream_end = false, palette = false;
  for (size_t p = 8; p + 12 <= b.size();) {
    const uint32_t len = be32(&b[p]);
    const uint8_t* type = &b[p + 4];
    if (static_cast<uint32_t>(crc32(0, type, len + 4)) != be32(&b[p + 8 + len])) {
      corrupt(name, f, "the CRC of chunk '" + std::string(reinterpret_cast<const char*>(type), 4) + "' at byte " +
                           std::to_string(p) + " does not match");
    }
    if (std::memcmp(type, "PLTE", 4) == 0) palette = true;
    if (std::memcmp(type, "IDAT", 4) == 0) {
      if (stream_end) corrupt(name, f, "IDAT data continues after the end of the compressed stream");
      z.next_in = const_cast<uint8_t*>(&b[p + 8]);
      z.avail_in = len;
      while ((z.avail_in > 0 || z.avail_out == 0) && !stream_end) {
        z.next_out = chunk_out.data();
        z.avail_out = static_cast<uInt>(chunk_out.size());
        const int rc = inflate(&z, Z_NO_FLUSH);
        if (rc != Z_OK && rc != Z_STREAM_END && rc != Z_BUF_ERROR) {
          corrupt(name, f, std::string("the compressed image data does not inflate (") + (z.msg ? z.msg : "zlib error") + ")");
        }
        stream_end = rc == Z_STREAM_END;
        // Walk what came out row by row: too much data, or a filter type above 4, is corrupt.
        for (size_t i = 0, n = chunk_out.size() - z.avail_out; i < n;) {
          if (pass >= rows.size()) corrupt(name, f, "there is more compressed image data than the IHDR size needs");
          if (at_in_row == 0 && chunk_out[i] > 4) corrupt(name, f, "a row has filter type " + std::to_string(chunk_out[i]));
          const uint64_t take = std::min<uint64_t>(n - i, rows[pass].second - at_in_row);
          i += take;
          at_in_row += take;
          if (at_in_row == rows[pass].second) {
            at_in_row = 0;
            if (++row == rows[pass].first) {
              row = 0;
              ++pass;
            }
          }
        }
        if (rc == Z_BUF_ERROR && z.avail_out != 0) break;  // needs the next IDAT
      }
    }
    if (std::memcmp(type, "IEND", 4) == 0) break;
    p += 12 + len;
  }
  if (color == 3 && !palette) corrupt(name, f, "a palette image has no PLTE chunk");
  if (!stream_end || pass < rows.size()) corrupt(name, f, "the compressed image data ends before the image does");
}

}  // namespace

void verify_image_data(std::span<const uint8_t> bytes, const ImageHeader& h, const std::string& name) {
  if (h.format == ImageFormat::kPng) return verify_png(bytes, name);
  char message[JMSG_LENGTH_MAX] = {};
  if (!jpeg_decodes(bytes.data(), bytes.size(), message)) corrupt(name, ImageFormat::kJpeg, message);
}

}  // namespace bev
