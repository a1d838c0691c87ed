// What the parts of the extension module share: the model object Python holds (PyModel: the
// bev::Model, its runner handle, the profiler sessions, the lock that orders them), and the
// conversions between Python objects and the engine's types.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <vector>

#include "bevformer/error.h"
#include "bevformer/frame.h"
#include "bevformer/model.h"
#include "bevformer/runner.h"

namespace bevpy {

namespace py = pybind11;

// A profiler session of a model; close() ends every one of its model's.
struct SessionBox {
  std::unique_ptr<bev::ProfileSession> session;
  std::unique_ptr<bev::ProfileReport> last_report;  // what write() writes
};

struct PyModel {
  std::unique_ptr<bev::Model> model;
  std::unique_ptr<bev::StageRunnerHandle> runner;
  bev::Knobs knobs;
  std::string config, weights;
  // Frames hold it shared, so Python threads drive streams at once; runner calls, profiler calls
  // and close() hold it alone. With Knobs::profiling frames hold it alone too: the profiler
  // records from one thread at a time, and a signpost must fall between frames, not inside one.
  std::shared_mutex mu;
  std::vector<std::weak_ptr<SessionBox>> sessions;
  std::atomic<double> last_forward_ms{0};  // geometry + both stages of the last frame (the profile's forward_ms)

  bev::Model& live(const char* what) const;  // Error(kInvalidInput) once closed
};

// Python object -> bev::Frame for Model::detect, with the frame JSON's checks (request.cpp).
// Image arrays and bytes are shared with Python, not copied (RGB arrays are copied to BGR).
bev::Frame frame_from_request(const py::dict& request);
// A frame JSON file as request kwargs (load_sample), images by absolute path or as bytes, or
// decoded to arrays when `decode`.
py::dict request_from_frame(const bev::Frame& frame, const std::string& base_dir, bool decode);
// The synthetic request of a config (request.cpp).
py::dict synthetic_request(const std::string& config, uint64_t seed, int index);
// An image file or encoded bytes decoded as the engine decodes them: uint8 HxWx3 BGR.
py::array read_image(const py::object& source);

// The bevformer.Error subclass instance of an engine error (module.cpp).
py::object error_object(const bev::Error& e);

// bev::Detections -> the dict the Python Result wraps (results.cpp).
py::dict detections_dict(const bev::Detections& d);

// The runner and profiler bindings (profiling.cpp).
void bind_profiling(py::module_& m, py::class_<PyModel, std::shared_ptr<PyModel>>& model);

// A frame JSON of the request (images inlined: arrays as PNG, files as their bytes).
std::string request_frame_json(const py::dict& request);

}  // namespace bevpy
