#include "render/video.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <vector>

#include <opencv2/core.hpp>
#include <opencv2/imgproc.hpp>
#include <opencv2/videoio.hpp>

#include "bevformer/error.h"
#include "core/log.h"

namespace bev {
namespace {

constexpr const char* kFormats = ".mp4 (H.264), .mkv (H.264) or .avi (Motion JPEG)";

std::string extension(const std::string& path) {
  std::string ext = std::filesystem::path(path).extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return ext;
}

struct Codec {
  const char* fourcc;
  int api;  // OpenCV's backend
};

// What to try for an extension, best first.
std::vector<Codec> codecs_for(const std::string& ext) {
  if (ext == ".mp4") return {{"avc1", cv::CAP_FFMPEG}, {"mp4v", cv::CAP_FFMPEG}};
  if (ext == ".mkv") return {{"avc1", cv::CAP_FFMPEG}};
  if (ext == ".avi") return {{"MJPG", cv::CAP_OPENCV_MJPEG}, {"MJPG", cv::CAP_ANY}};
  return {};
}

}  // namespace

void check_video_path(const std::string& path) {
  const std::string ext = extension(path);
  if (codecs_for(ext).empty()) {
    throw Error(ErrorKind::kInvalidInput,
                ext.empty() ? "the video's file name has no extension" : "'" + ext + "' is not a video format this writes")
        .where(path)
        .expected(kFormats);
  }
}

struct VideoWriter::Impl {
  cv::VideoWriter writer;
  cv::Size size;  // even
};

VideoWriter::VideoWriter(std::string path, double fps) : path_(std::move(path)), fps_(fps) {
  check_video_path(path_);
  if (!(fps_ > 0 && fps_ <= 1000)) {
    throw Error(ErrorKind::kInvalidInput, "video frame rate " + std::to_string(fps_)).expected("0 < fps <= 1000");
  }
}

VideoWriter::~VideoWriter() {
  try {
    finish();
  } catch (...) {  // a destructor must not throw; finish() called explicitly reports it
  }
}

void VideoWriter::write(const uint8_t* bgr, int width, int height) {
  if (bgr == nullptr || width <= 0 || height <= 0) {
    throw Error(ErrorKind::kInternal, "an empty video frame").where(path_);
  }
  const cv::Mat frame(height, width, CV_8UC3, const_cast<uint8_t*>(bgr));
  if (!impl_) {
    impl_ = std::make_unique<Impl>();
    impl_->size = cv::Size(width + width % 2, height + height % 2);
    for (const Codec& c : codecs_for(extension(path_))) {
      const int fourcc = cv::VideoWriter::fourcc(c.fourcc[0], c.fourcc[1], c.fourcc[2], c.fourcc[3]);
      if (impl_->writer.open(path_, c.api, fourcc, fps_, impl_->size, true)) {
        codec_ = c.fourcc;
        break;
      }
    }
    if (codec_.empty()) {
      impl_.reset();
      throw Error(ErrorKind::kUnsupported, "this build's OpenCV cannot write this video (no encoder for it)")
          .where(path_)
          .expected(".avi (Motion JPEG, OpenCV's own writer) where FFmpeg is missing; " + std::string(kFormats) +
                    " with libopencv-videoio's FFmpeg backend");
    }
    if (extension(path_) == ".mp4" && codec_ != "avc1") {
      log_warn("video: no H.264 encoder; ", path_, " is MPEG-4 Part 2 ('", codec_, "'), which some players lack");
    }
  }
  cv::Mat out;
  if (frame.cols == impl_->size.width && frame.rows == impl_->size.height) {
    out = frame;
  } else if (frame.cols + frame.cols % 2 == impl_->size.width && frame.rows + frame.rows % 2 == impl_->size.height) {
    cv::copyMakeBorder(frame, out, 0, impl_->size.height - frame.rows, 0, impl_->size.width - frame.cols,
                       cv::BORDER_REPLICATE);
  } else {
    cv::resize(frame, out, impl_->size, 0, 0, cv::INTER_AREA);
  }
  impl_->writer.write(out);
  ++frames_;
}

void VideoWriter::finish() {
  if (!impl_) return;
  impl_->writer.release();
  impl_.reset();
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path_, ec) || std::filesystem::file_size(path_, ec) == 0) {
    throw Error(ErrorKind::kIo, "the video was not written").where(path_);
  }
}

}  // namespace bev
