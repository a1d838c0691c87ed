// model.runner (the recorded stages replayed, run eagerly, described) and the profiler sessions
// behind bevformer.profiling. Every call here holds the model's lock alone, with the GIL
// released: no frame runs meanwhile, so a replay or an eager run has the machine to itself and
// a signpost falls between frames.
#include "common.h"
#include "bevformer/profile.h"

namespace bevpy {
namespace {

using bev::Error;
using bev::ErrorKind;

py::dict stage_run_dict(const bev::StageRun& r) {
  py::dict d;
  d["variant"] = r.variant;
  d["stage"] = r.stage;
  d["seconds"] = r.seconds;
  return d;
}

// Runs `f` on the model alone, without the GIL.
template <typename F>
auto alone(PyModel& pm, F&& f) {
  py::gil_scoped_release nogil;
  const std::unique_lock<std::shared_mutex> lock(pm.mu);
  return f();
}

struct SessionHandle {
  std::shared_ptr<PyModel> model;
  std::shared_ptr<SessionBox> box;

  SessionHandle() = default;
  SessionHandle(const SessionHandle&) = delete;
  SessionHandle& operator=(const SessionHandle&) = delete;
  // Python drops it with the GIL held; the session detaches only between frames.
  ~SessionHandle() {
    if (!model || !box) return;
    py::gil_scoped_release nogil;
    const std::unique_lock<std::shared_mutex> lock(model->mu);
    box->session.reset();
  }

  bev::ProfileSession& live() const {
    if (!box->session) {
      throw Error(ErrorKind::kInvalidInput, "the model of this profiler is closed").where("profiler");
    }
    return *box->session;
  }
};

}  // namespace

void bind_profiling(py::module_& m, py::class_<PyModel, std::shared_ptr<PyModel>>& model) {
  model.def("runner_replay", [](PyModel& pm, const std::string& variant) {
    return stage_run_dict(alone(pm, [&] {
      pm.live("runner.replay");
      return pm.runner->replay(variant);
    }));
  }, py::arg("variant"));
  model.def("runner_run_eager", [](PyModel& pm, const std::string& variant) {
    return stage_run_dict(alone(pm, [&] {
      pm.live("runner.run_eager");
      return pm.runner->run_eager(variant);
    }));
  }, py::arg("variant"));
  model.def("runner_prepare_eager", [](PyModel& pm) {
    alone(pm, [&] {
      pm.live("runner.prepare_eager");
      pm.runner->prepare_eager();
      return 0;
    });
  });
  model.def("runner_describe", [](PyModel& pm) {
    return alone(pm, [&] {
      pm.live("runner.describe");
      return pm.runner->describe();
    });
  });
  model.def("runner_stages", [](PyModel& pm) {
    const std::vector<bev::RecordedStageInfo> stages = alone(pm, [&] {
      pm.live("runner.stages");
      return pm.runner->stages();
    });
    py::list out;
    for (const bev::RecordedStageInfo& s : stages) {
      py::dict d;
      d["name"] = s.name;
      d["ops"] = s.ops;
      d["buffers"] = s.buffers;
      d["arena_bytes"] = s.arena_bytes;
      d["no_reuse_bytes"] = s.no_reuse_bytes;
      out.append(d);
    }
    return out;
  });

  py::class_<bev::ProfiledOp>(m, "OpRecord", "One op the profiler recorded (times in ms since the profiler began).")
      .def_readonly("index", &bev::ProfiledOp::index)
      .def_readonly("name", &bev::ProfiledOp::name)
      .def_readonly("stage", &bev::ProfiledOp::stage)
      .def_readonly("label", &bev::ProfiledOp::label)
      .def_readonly("inputs", &bev::ProfiledOp::inputs)
      .def_readonly("outputs", &bev::ProfiledOp::outputs)
      .def_readonly("start_ms", &bev::ProfiledOp::start_ms)
      .def_readonly("ms", &bev::ProfiledOp::ms)
      .def_readonly("gflop", &bev::ProfiledOp::gflop)
      .def_readonly("gbyte", &bev::ProfiledOp::gbyte)
      .def("as_dict", [](const bev::ProfiledOp& o) {
        py::dict d;
        d["index"] = o.index;
        d["name"] = o.name;
        d["stage"] = o.stage;
        d["label"] = o.label;
        d["inputs"] = o.inputs;
        d["outputs"] = o.outputs;
        d["start_ms"] = o.start_ms;
        d["ms"] = o.ms;
        d["gflop"] = o.gflop;
        d["gbyte"] = o.gbyte;
        return d;
      })
      .def("__repr__", [](const bev::ProfiledOp& o) {
        return "<OpRecord #" + std::to_string(o.index) + " " + o.name + " " + o.stage + " " + o.label + " " +
               std::to_string(o.ms) + " ms: " + o.inputs + " -> " + o.outputs + ">";
      });

  py::class_<SessionHandle, std::shared_ptr<SessionHandle>>(m, "_ProfileSession")
      .def(py::init([](const std::shared_ptr<PyModel>& pm) {
        auto h = std::make_shared<SessionHandle>();
        h->model = pm;
        h->box = std::make_shared<SessionBox>();
        alone(*pm, [&] {
          h->box->session = std::make_unique<bev::ProfileSession>(pm->live("profiler"));
          pm->sessions.push_back(h->box);
          return 0;
        });
        return h;
      }), py::arg("model"))
      .def("start", [](SessionHandle& h) { alone(*h.model, [&] { h.live().start(); return 0; }); })
      .def("stop", [](SessionHandle& h) { alone(*h.model, [&] { h.live().stop(); return 0; }); })
      .def("running", [](SessionHandle& h) { return h.box->session && h.box->session->running(); })
      .def("signpost", [](SessionHandle& h, const std::string& name) {
        alone(*h.model, [&] { h.live().signpost(name); return 0; });
      }, py::arg("name"))
      .def("ops", [](SessionHandle& h) { return alone(*h.model, [&] { return h.live().ops(); }); })
      .def("op_count", [](SessionHandle& h) { return alone(*h.model, [&] { return h.live().op_count(); }); })
      .def("signposts", [](SessionHandle& h) {
        const std::vector<bev::ProfiledSignpost> s = alone(*h.model, [&] { return h.live().signposts(); });
        py::list out;
        for (const bev::ProfiledSignpost& p : s) out.append(py::make_tuple(p.name, p.t_ms));
        return out;
      })
      .def("report", [](SessionHandle& h, bool measure_peaks, bool measure_unprofiled) {
        return alone(*h.model, [&] {
          bev::SessionReportOptions o;
          o.measure_peaks = measure_peaks;
          o.measure_unprofiled = measure_unprofiled;
          o.forward_ms = h.model->last_forward_ms.load();
          h.box->last_report = std::make_unique<bev::ProfileReport>(h.live().report(o));
          return bev::profile_summary_json(*h.box->last_report);
        });
      }, py::arg("measure_peaks") = true, py::arg("measure_unprofiled") = true)
      .def("write", [](SessionHandle& h, const std::string& dir, int top_ops) {
        return alone(*h.model, [&] {
          bev::ProfileSession& s = h.live();
          if (!h.box->last_report) {
            throw Error(ErrorKind::kInvalidInput, "no report yet").where("profiler.write").expected("report() first");
          }
          return s.write(dir, *h.box->last_report, top_ops);
        });
      }, py::arg("dir"), py::arg("top_ops") = 15);
}

}  // namespace bevpy
