// A backend turns OpNodes into computation on one device. prepare() runs once per weighted op at
// model load (weight packing, primitive creation); run() executes a node on its tensors and must
// be callable again on the same node (replay) with the same result.
#pragma once

#include <memory>

#include "backend/op.h"

namespace bev {

class ThreadPool;

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  virtual Device device() const = 0;
  virtual Precision precision() const = 0;

  // State for conv2d, deform_conv2d and linear: `weight` in PyTorch layout (OIHW or [out, in]),
  // `bias` optional. The returned object is immutable and shared by every node that uses it.
  // bottleneck: `weight` is undefined, the members are in BottleneckAttrs.
  virtual std::shared_ptr<const void> prepare(OpKind kind, const OpAttrs& attrs, const Tensor& weight,
                                              const Tensor* bias) = 0;
  virtual void run(const OpNode& node) = 0;

  // Whether a stride-1 bottleneck on input x_nhwc runs faster as one fused op (Ops::bottleneck)
  // than conv by conv. Pure, so that a decorator cannot forget to forward it (a model run through
  // a decorator must emit the same ops).
  virtual bool fuses_bottleneck(const Shape& x_nhwc, const BottleneckAttrs& attrs) const = 0;
};

// threads <= 0: one per hardware thread. The pool and oneDNN's OpenMP pool are both sized by it.
std::unique_ptr<Backend> make_cpu_backend(int threads, Precision precision);

}  // namespace bev
