// The library in a few lines: load a model, run frame JSON files (docs/FORMATS.md) through it,
// print the confident boxes. Each frame's "stream" keeps its own history (previous BEV, pose),
// so frames of one vehicle should come in time order.
//
//   detect_frames CONFIG WEIGHTS FRAME.json...
//     CONFIG   tiny | small | base | an upstream-style config JSON
//     WEIGHTS  a .pth or .safetensors checkpoint, or - for seeded random (untrained) weights
#include <bevformer/error.h>
#include <bevformer/model.h>

#include <cstdio>
#include <string>

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s CONFIG WEIGHTS|- FRAME.json...\n", argv[0]);
    return 2;
  }
  bev::Knobs knobs;  // threads, precision ("f32" | "bf16"), streams kept, replay, pipeline
  const std::string weights = std::string(argv[2]) == "-" ? "" : argv[2];
  try {
    const auto model = bev::Model::load(argv[1], weights, knobs);
    if (model->untrained()) std::printf("untrained weights: the boxes are meaningless\n");
    for (int k = 3; k < argc; ++k) {
      const bev::Detections d = model->detect_file(argv[k]);
      std::printf("%s: stream %s, t=%.3f, %zu boxes, %s, %.2f s\n", argv[k], d.stream.c_str(), d.timestamp,
                  d.boxes.size(), d.used_history ? "with history" : "first frame", d.seconds);
      for (const bev::Box& b : d.boxes) {
        if (b.score < 0.3) break;  // boxes come by descending score
        std::printf("  %-20s %.2f  x %7.2f  y %7.2f  z %6.2f  yaw %6.2f\n", b.class_name.c_str(), b.score, b.center[0],
                    b.center[1], b.center[2], b.yaw);
      }
      // d.json is the detections document (docs/FORMATS.md), ready to write or send on.
    }
  } catch (const bev::Error& e) {  // bad input says what, where and what was expected
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
  return 0;
}
