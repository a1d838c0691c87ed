// bevformer._bevformer: the engine's Model for Python. bev::Error becomes a Python exception of
// the error's kind that carries its parts; frames run with the GIL released, so Python threads
// drive several streams at once. The Python package (python/bevformer) wraps this module.
#include <dnnl.hpp>
#include <filesystem>
#include <optional>
#include <opencv2/core/version.hpp>

#include "bevformer/convert.h"
#include "common.h"

#ifndef BEV_VERSION
#error "BEV_VERSION is defined by python/CMakeLists.txt"
#endif

namespace bevpy {
namespace {

using bev::Error;
using bev::ErrorKind;

// The exception classes, by ErrorKind: bevformer.Error and one subclass per kind, each also
// deriving from the builtin a Python caller would catch for it.
struct ErrorClass {
  ErrorKind kind;
  const char* name;  // bevformer.<name>
  const char* id;    // Error.kind
  PyObject* builtin;
  PyObject* cls = nullptr;
};
PyObject* g_error = nullptr;
ErrorClass g_errors[] = {
    {ErrorKind::kInvalidInput, "InvalidInputError", "invalid_input", PyExc_ValueError},
    {ErrorKind::kNotFound, "NotFoundError", "not_found", PyExc_FileNotFoundError},
    {ErrorKind::kUnsupported, "UnsupportedError", "unsupported", PyExc_NotImplementedError},
    {ErrorKind::kIo, "IoError", "io", PyExc_OSError},
    {ErrorKind::kInternal, "InternalError", "internal", PyExc_RuntimeError},
    {ErrorKind::kBusy, "BusyError", "busy", PyExc_RuntimeError},
};

}  // namespace

// The bevformer.Error subclass instance of an engine error, carrying its parts.
py::object error_object(const Error& e) {
  PyObject* cls = g_error;
  const char* id = "error";
  for (const ErrorClass& c : g_errors) {
    if (c.kind == e.kind()) {
      cls = c.cls;
      id = c.id;
    }
  }
  const std::string message = std::string(bev::error_kind_name(e.kind())) + ": " + e.what();
  py::object inst = py::reinterpret_steal<py::object>(PyObject_CallFunction(cls, "s", message.c_str()));
  if (!inst) throw py::error_already_set();
  inst.attr("kind") = id;
  inst.attr("problem") = e.problem();
  inst.attr("where") = e.place();
  inst.attr("expected") = e.expectation();
  inst.attr("hint") = e.fix_hint();
  inst.attr("offset") = e.offset() ? py::object(py::int_(*e.offset())) : py::object(py::none());
  return inst;
}

namespace {

void add_errors(py::module_& m) {
  g_error = PyErr_NewExceptionWithDoc("bevformer.Error",
                                      "An error of the engine: .kind, .problem, .where, .expected, .hint, .offset "
                                      "(bev::Error's parts); str() is the engine's one-line message.",
                                      PyExc_Exception, nullptr);
  m.attr("Error") = py::reinterpret_borrow<py::object>(g_error);
  for (ErrorClass& e : g_errors) {
    const std::string qualified = std::string("bevformer.") + e.name;
    py::tuple bases = py::make_tuple(py::reinterpret_borrow<py::object>(g_error), py::reinterpret_borrow<py::object>(e.builtin));
    e.cls = PyErr_NewException(qualified.c_str(), bases.ptr(), nullptr);
    m.attr(e.name) = py::reinterpret_borrow<py::object>(e.cls);
  }
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error& e) {
      py::object inst;
      try {
        inst = error_object(e);
      } catch (py::error_already_set& failed) {
        failed.restore();  // making the exception failed: that error stands
        return;
      }
      PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(inst.ptr())), inst.ptr());
    }
  });
}

bev::Knobs knobs_from(const py::dict& d) {
  bev::Knobs k;
  for (const auto& [key_obj, v] : d) {
    const std::string key = py::str(key_obj).cast<std::string>();
    try {
      if (key == "backend") k.backend = v.cast<std::string>();
      else if (key == "device") k.device = v.cast<int>();
      else if (key == "threads") k.threads = v.cast<int>();
      else if (key == "precision") k.precision = v.cast<std::string>();
      else if (key == "calibration") k.calibration = v.cast<std::string>();
      else if (key == "seed") k.seed = v.cast<uint64_t>();
      else if (key == "max_streams") k.max_streams = v.cast<size_t>();
      else if (key == "stream_ttl_seconds") k.stream_ttl_seconds = v.cast<double>();
      else if (key == "max_gap_seconds") k.max_gap_seconds = v.cast<double>();
      else if (key == "replay") k.replay = v.cast<bool>();
      else if (key == "pipeline") k.pipeline = v.cast<bool>();
      else if (key == "max_batch") k.max_batch = v.cast<int>();
      else if (key == "profiling") k.profiling = v.cast<bool>();
      else {
        throw Error(ErrorKind::kInvalidInput, "an unknown knob").where("knobs: " + key)
            .expected("backend, device, threads, precision, calibration, seed, max_streams, stream_ttl_seconds, max_gap_seconds, "
                      "replay, pipeline, max_batch, profiling");
      }
    } catch (const py::cast_error&) {
      throw Error(ErrorKind::kInvalidInput, "a " + py::str(py::type::of(v).attr("__name__")).cast<std::string>())
          .where("knobs: " + key)
          .expected("the type of Knobs::" + key + " (docs/PYTHON.md)");
    }
  }
  return k;
}

py::dict knobs_dict(const bev::Knobs& k) {
  py::dict d;
  d["backend"] = k.backend;
  d["device"] = k.device;
  d["threads"] = k.threads;
  d["precision"] = k.precision;
  d["calibration"] = k.calibration;
  d["seed"] = k.seed;
  d["max_streams"] = k.max_streams;
  d["stream_ttl_seconds"] = k.stream_ttl_seconds;
  d["max_gap_seconds"] = k.max_gap_seconds;
  d["replay"] = k.replay;
  d["pipeline"] = k.pipeline;
  d["max_batch"] = k.max_batch;
  d["profiling"] = k.profiling;
  return d;
}

py::dict versions() {
  py::dict v;
  v["bevformer"] = BEV_VERSION;
  const dnnl_version_t* d = dnnl_version();
  v["onednn"] = std::to_string(d->major) + "." + std::to_string(d->minor) + "." + std::to_string(d->patch);
  v["opencv"] = CV_VERSION;
  v["pybind11"] = std::to_string(PYBIND11_VERSION_MAJOR) + "." + std::to_string(PYBIND11_VERSION_MINOR) + "." +
                  std::to_string(PYBIND11_VERSION_PATCH);
  return v;
}

// A frame on the model, the GIL released: shared with other frames, alone when profiling.
py::dict run_frame(PyModel& pm, const bev::Frame& frame, const std::string& base_dir) {
  bev::Detections d;
  {
    py::gil_scoped_release nogil;
    std::shared_lock<std::shared_mutex> shared(pm.mu, std::defer_lock);
    std::unique_lock<std::shared_mutex> alone(pm.mu, std::defer_lock);
    if (pm.knobs.profiling) {
      alone.lock();
    } else {
      shared.lock();
    }
    d = pm.live("detect").detect(frame, base_dir);
    pm.runner->set_last_frame(frame, base_dir);
    pm.last_forward_ms = 1e3 * (d.geometry_seconds + d.image_seconds + d.bev_seconds);
  }
  return detections_dict(d);
}

}  // namespace

bev::Model& PyModel::live(const char* what) const {
  if (!model) {
    throw Error(ErrorKind::kInvalidInput, "the model is closed").where(what).expected("a model that is not closed");
  }
  return *model;
}

}  // namespace bevpy

PYBIND11_MODULE(_bevformer, m) {
  using namespace bevpy;
  m.doc() = "bevformer.cpp's engine for Python (the bevformer package wraps it; docs/PYTHON.md)";
  m.attr("__version__") = BEV_VERSION;
  // pybind11 (before 2.12) finds numpy's C API on first use through a function-local static
  // whose initializer imports numpy, which releases the GIL: two threads making their first
  // arrays at once deadlock on the static's guard. Found here, while the import holds the GIL.
  py::module_::import("numpy");
  (void)py::array_t<uint8_t>(0);
  add_errors(m);
  m.def("versions", &versions, "library versions of this build");
  m.def("available_backends", &bev::available_backends);
  m.def("require_backend", &bev::require_backend, py::arg("backend"));
  m.def("read_image", &read_image, py::arg("source"));
  m.def("synthetic_request", &synthetic_request, py::arg("config"), py::arg("seed"), py::arg("index"));
  m.def("frame_json", &request_frame_json, py::arg("request"));
  m.def("load_sample", [](const std::string& path, bool decode) {
    bev::Frame f;
    {
      py::gil_scoped_release nogil;
      f = bev::read_frame(path);
    }
    const std::string dir = std::filesystem::path(path).parent_path().string();
    return request_from_frame(f, dir.empty() ? "." : dir, decode);
  }, py::arg("path"), py::arg("decode") = false);
  m.def("write_random_weights", [](const std::string& config, uint64_t seed, const std::string& path) {
    py::gil_scoped_release nogil;
    return bev::write_random_weights(config, seed, path);
  }, py::arg("config"), py::arg("seed"), py::arg("path"));

  m.def("convert_info", [](const std::string& info, const std::string& out_dir, const std::string& stream,
                           const std::string& scene) {
    py::gil_scoped_release nogil;
    return bev::convert_nuscenes_info({info, out_dir, stream, scene, ""});
  }, py::arg("info"), py::arg("out_dir"), py::arg("stream") = "", py::arg("scene") = "");
  m.def("nuscenes_results_json", [](const py::iterable& frames) {
    // Results (or dicts) of posed frames with a sample token, in the order given, as `bevformer
    // detect` writes results_nusc.json.
    std::vector<bev::Detections> ds;
    for (const py::handle& h : frames) {
      auto get = [&](const char* k) { return py::isinstance<py::dict>(h) ? py::object(h[k]) : h.attr(k); };
      bev::Detections d;
      d.stream = get("stream").cast<std::string>();
      d.timestamp = get("timestamp").cast<double>();
      d.sample_token = get("sample_token").cast<std::string>();
      d.nuscenes_json = get("nuscenes_json").cast<std::string>();
      ds.push_back(std::move(d));
    }
    return bev::nuscenes_results_json(ds);
  }, py::arg("results"));

  py::class_<PyModel, std::shared_ptr<PyModel>> model(m, "_Model");
  model.def(py::init([](const std::string& config, const std::string& weights, const py::dict& knobs) {
    auto pm = std::make_shared<PyModel>();
    pm->knobs = knobs_from(knobs);
    pm->config = config;
    pm->weights = weights;
    {
      py::gil_scoped_release nogil;
      pm->model = bev::Model::load(config, weights, pm->knobs);
      pm->runner = std::make_unique<bev::StageRunnerHandle>(*pm->model);
    }
    return pm;
  }), py::arg("config"), py::arg("weights"), py::arg("knobs"));
  model.def("detect", [](PyModel& pm, const py::dict& request) {
    const bev::Frame frame = frame_from_request(request);
    return run_frame(pm, frame, ".");
  }, py::arg("request"));
  model.def("detect_batch", [](PyModel& pm, const py::list& requests, int max_batch) {
    // Model::detect_batch: frames of distinct streams run together, each as if alone, each
    // stream's in order. A request that is not a frame fails alone too, as a frame would.
    std::vector<std::optional<Error>> refused(requests.size());
    std::vector<bev::Frame> frames;
    for (size_t i = 0; i < requests.size(); ++i) {
      try {
        const py::handle r = requests[i];
        if (!py::isinstance<py::dict>(r)) {
          throw Error(ErrorKind::kInvalidInput, "a " + py::str(py::type::of(r).attr("__name__")).cast<std::string>())
              .where("requests[" + std::to_string(i) + "]")
              .expected("a mapping of the request's fields");
        }
        frames.push_back(frame_from_request(py::reinterpret_borrow<py::dict>(r)));
      } catch (const Error& e) {
        refused[i] = e;
      }
    }
    std::vector<bev::FrameOutcome> out;
    {
      py::gil_scoped_release nogil;
      std::shared_lock<std::shared_mutex> shared(pm.mu, std::defer_lock);
      std::unique_lock<std::shared_mutex> alone(pm.mu, std::defer_lock);
      if (pm.knobs.profiling) {
        alone.lock();
      } else {
        shared.lock();
      }
      bev::Model& live = pm.live("detect_batch");
      out = live.detect_batch(frames, ".", {}, max_batch);
      for (size_t k = out.size(); k-- > 0;) {
        if (out[k].detections) {
          pm.runner->set_last_frame(frames[k], ".");
          break;
        }
      }
    }
    py::list results;
    size_t k = 0;
    for (size_t i = 0; i < requests.size(); ++i) {
      if (refused[i]) {
        results.append(error_object(*refused[i]));
        continue;
      }
      const bev::FrameOutcome& o = out[k++];
      if (o.detections) {
        py::dict d = detections_dict(*o.detections);
        d["batch_size"] = o.batch_size;
        results.append(d);
      } else {
        results.append(error_object(o.error ? *o.error : Error(ErrorKind::kInternal, "a frame with no outcome")));
      }
    }
    return results;
  }, py::arg("requests"), py::arg("max_batch") = 0);
  model.def("detect_file", [](PyModel& pm, const std::string& path) {
    bev::Frame frame;
    {
      py::gil_scoped_release nogil;
      frame = bev::read_frame(path);
    }
    const std::string dir = std::filesystem::path(path).parent_path().string();
    return run_frame(pm, frame, dir.empty() ? "." : dir);
  }, py::arg("path"));
  model.def("streams", [](PyModel& pm) {
    py::list out;
    for (const bev::StreamStatus& s : pm.live("streams").streams()) {
      py::dict d;
      d["id"] = s.id;
      d["frames"] = s.frames;
      d["last_timestamp"] = s.last_timestamp;
      d["idle_seconds"] = s.idle_seconds;
      d["has_history"] = s.has_history;
      d["busy"] = s.busy;
      out.append(d);
    }
    return out;
  });
  model.def("drop_stream", [](PyModel& pm, const std::string& id) { return pm.live("drop_stream").drop_stream(id); },
            py::arg("id"));
  model.def("stream_totals", [](PyModel& pm) {
    const bev::StreamTotals t = pm.live("stream_totals").stream_totals();
    py::dict d;
    d["active"] = t.active;
    d["created"] = t.created;
    d["evicted_lru"] = t.evicted_lru;
    d["evicted_ttl"] = t.evicted_ttl;
    d["dropped"] = t.dropped;
    d["resets_gap"] = t.resets_gap;
    d["resets_backwards"] = t.resets_backwards;
    d["resets_scene"] = t.resets_scene;
    d["frames_nonfinite"] = t.frames_nonfinite;
    return d;
  });
  model.def("device_info", [](PyModel& pm) {
    const bev::DeviceInfo i = pm.live("device_info").device_info();
    py::dict d;
    d["backend"] = i.backend;
    d["device"] = i.device;
    d["isa"] = i.isa;
    d["threads"] = i.threads;
    d["precision"] = i.precision;
    d["float_precision"] = i.float_precision;
    d["versions"] = versions();
    return d;
  });
  model.def("knobs", [](PyModel& pm) { return knobs_dict(pm.knobs); });
  model.def("describe", [](PyModel& pm) {
    py::gil_scoped_release nogil;
    const std::unique_lock<std::shared_mutex> alone(pm.mu);
    return pm.live("describe").describe();
  });
  model.def("config_summary", [](PyModel& pm) { return pm.live("config_summary").config_summary(); });
  model.def("class_names", [](PyModel& pm) { return pm.live("class_names").class_names(); });
  model.def("untrained", [](PyModel& pm) { return pm.live("untrained").untrained(); });
  model.def("closed", [](PyModel& pm) { return pm.model == nullptr; });
  model.def("close", [](PyModel& pm) {
    py::gil_scoped_release nogil;
    const std::unique_lock<std::shared_mutex> alone(pm.mu);  // waits for frames in flight
    for (const std::weak_ptr<SessionBox>& w : pm.sessions) {
      if (const std::shared_ptr<SessionBox> box = w.lock()) box->session.reset();
    }
    pm.sessions.clear();
    pm.runner.reset();
    pm.model.reset();
  });
  bind_profiling(m, model);
}
