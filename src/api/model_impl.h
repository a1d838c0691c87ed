// What a Model holds, for the api/ files that implement its parts (model_api.cpp and the
// surfaces added beside it): the engine, and what the model says about its weights.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "bevformer/model.h"
#include "runtime/engine.h"

namespace bev {

struct Model::Impl {
  bool untrained = false;
  std::string fingerprint;       // config + weights + backend + precision (runtime/stream_handoff.h)
  std::string weights_name;
  std::unique_ptr<Engine> engine;
  uint64_t weight_bytes = 0;  // the checkpoint's tensors
  int max_batch = 8;          // Knobs::max_batch
};

// How the api/ files beside model_api.cpp (runner_api.cpp, ...) reach a Model's Impl (Model
// names this struct its friend).
struct ModelInternals {
  using Impl = Model::Impl;  // the name other api/ files may use
  static Impl& of(Model& model) { return *model.impl_; }
};

}  // namespace bev
