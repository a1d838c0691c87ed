// A run's pictures as one video file (`bevformer detect --video`), with OpenCV's video writer.
// The extension picks the container and codec:
//
//   .mp4   H.264 ('avc1') through OpenCV's FFmpeg backend: what every standard player and browser
//          opens. Where that encoder is missing, MPEG-4 Part 2 ('mp4v') with a warning.
//   .mkv   H.264 in Matroska (FFmpeg backend).
//   .avi   Motion JPEG: OpenCV writes it with its own code, no FFmpeg needed.
//
// Anything else is refused by name before any work (check_video_path), and a writer that cannot
// be opened says which formats this build can write. Frames are BGR rows; the first fixes the
// video's size (padded to even sizes, which H.264's 4:2:0 needs) and later frames of another size
// are scaled to it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace bev {

// Throws Error(kInvalidInput) naming .mp4, .mkv and .avi when `path` has none of them.
void check_video_path(const std::string& path);

class VideoWriter {
 public:
  // Opens nothing yet: the first frame fixes the size. fps > 0.
  VideoWriter(std::string path, double fps);
  ~VideoWriter();
  VideoWriter(const VideoWriter&) = delete;
  VideoWriter& operator=(const VideoWriter&) = delete;

  // One frame: `bgr` is height rows of width * 3 bytes.
  void write(const uint8_t* bgr, int width, int height);
  // Closes the file (Error kIo when nothing could be written). Also done by the destructor,
  // which swallows errors.
  void finish();
  int frames() const { return frames_; }
  const std::string& codec() const { return codec_; }  // "avc1", "mp4v", "MJPG" once open

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string path_;
  double fps_;
  int frames_ = 0;
  std::string codec_;
};

}  // namespace bev
