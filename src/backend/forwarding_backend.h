// A backend that forwards every call to another: the base of the decorators (the profiler's,
// the calibration's, the tests' taps), which override only what they add.
//
// run() forwards; run_timed() and execute() are Backend's own, which time and replay a recorded
// stage node by node through this object's run(), so a decorator that overrides run() sees every
// node of a replay too. A decorator that wants the inner backend's timing or whole-stage launch
// overrides them (ProfilingBackend does).
#pragma once

#include <memory>
#include <string>

#include "backend/backend.h"

namespace bev {

class ForwardingBackend : public Backend {
 public:
  explicit ForwardingBackend(Backend& inner) : inner_(inner) {}
  Backend& inner() { return inner_; }

  const char* name() const override { return inner_.name(); }
  Device device() const override { return inner_.device(); }
  Precision precision() const override { return inner_.precision(); }
  Precision float_precision() const override { return inner_.float_precision(); }
  BackendInfo info() const override { return inner_.info(); }
  std::shared_ptr<Storage> allocate(size_t bytes) override { return inner_.allocate(bytes); }
  void write(const Tensor& dst, const Tensor& host_src) override { inner_.write(dst, host_src); }
  std::shared_ptr<Storage> allocate_host(size_t bytes) override { return inner_.allocate_host(bytes); }
  bool wants_staging() const override { return inner_.wants_staging(); }
  void read_into(const Tensor& host_dst, const Tensor& src) override { inner_.read_into(host_dst, src); }
  void copy(const Tensor& dst, const Tensor& src) override { inner_.copy(dst, src); }
  void synchronize() override { inner_.synchronize(); }
  double measure_peak_gflops() override { return inner_.measure_peak_gflops(); }
  std::shared_ptr<const void> prepare(OpKind kind, const OpAttrs& attrs, const Tensor& weight,
                                      const Tensor* bias) override {
    return inner_.prepare(kind, attrs, weight, bias);
  }
  bool fuses_bottleneck(const Shape& x_nhwc, const BottleneckAttrs& attrs) const override {
    return inner_.fuses_bottleneck(x_nhwc, attrs);
  }
  bool fuses_deformable_attention() const override { return inner_.fuses_deformable_attention(); }
  bool fuses_spatial_cross_attention() const override { return inner_.fuses_spatial_cross_attention(); }
  bool fuses_ffn() const override { return inner_.fuses_ffn(); }
  void run(const OpNode& node) override { inner_.run(node); }
  void enter_stage(const std::string& stage) override { inner_.enter_stage(stage); }

 protected:
  Backend& inner_;
};

}  // namespace bev
