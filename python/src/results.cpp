// A frame's detections as the dict bevformer.Result wraps: numpy arrays in mmdet3d's layout
// (boxes K x 9 float32: x, y, z, w, l, h, yaw, vx, vy in the LiDAR frame; scores float32; labels
// int64), the names, the stream's state and the stage times, and the detections JSON.
#include <cstring>

#include "common.h"

namespace bevpy {

py::dict detections_dict(const bev::Detections& d) {
  const auto k = static_cast<py::ssize_t>(d.boxes.size());
  // float32, as the engine computed them (bev::Box widens them to double losslessly).
  py::array_t<float> boxes({k, py::ssize_t{9}});
  py::array_t<float> scores(k);
  py::array_t<int64_t> labels(k), query(k);
  float* b = boxes.mutable_data();
  py::list names;
  for (py::ssize_t i = 0; i < k; ++i) {
    const bev::Box& x = d.boxes[static_cast<size_t>(i)];
    const double v[9] = {x.center[0], x.center[1], x.center[2], x.size[0], x.size[1], x.size[2], x.yaw,
                         x.velocity[0], x.velocity[1]};
    for (int j = 0; j < 9; ++j) b[i * 9 + j] = static_cast<float>(v[j]);
    scores.mutable_data()[i] = static_cast<float>(x.score);
    labels.mutable_data()[i] = x.label;
    query.mutable_data()[i] = x.query;
    names.append(x.class_name);
  }
  py::dict seconds;
  seconds["total"] = d.seconds;
  seconds["prepare"] = d.prepare_seconds;
  seconds["geometry"] = d.geometry_seconds;
  seconds["image"] = d.image_seconds;
  seconds["bev"] = d.bev_seconds;
  seconds["output"] = d.output_seconds;

  py::dict out;
  out["boxes"] = boxes;
  out["scores"] = scores;
  out["labels"] = labels;
  out["query"] = query;
  out["class_names"] = names;
  out["stream"] = d.stream;
  out["timestamp"] = d.timestamp;
  out["scene"] = d.scene;
  out["frame_index"] = d.frame_index;
  out["used_history"] = d.used_history;
  out["history_reset"] = d.history_reset;
  out["untrained"] = d.untrained;
  out["sample_token"] = d.sample_token;
  out["seconds"] = seconds;
  out["batch_size"] = 1;  // Model::detect_batch's frames say how many ran together
  out["json"] = d.json;
  out["nuscenes_json"] = d.nuscenes_json;
  return out;
}

}  // namespace bevpy
