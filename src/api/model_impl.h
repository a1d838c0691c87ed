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
  std::string weights_name;
  std::unique_ptr<Engine> engine;
  uint64_t weight_bytes = 0;  // the checkpoint's tensors
  int max_batch = 8;          // Knobs::max_batch
};

}  // namespace bev
