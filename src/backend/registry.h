// The one list of backends compiled into this binary. Everything that builds an engine (Model,
// golden, bench, profile, the server) asks here by name, so adding a backend is one entry.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace bev {

struct BackendOptions {
  int threads = 0;  // CPU threads for the kernels (and the host side of a device backend); <= 0: all
  Precision precision = Precision::kF32;
  int device = 0;   // which GPU, for device backends
};

// The backends this binary can make, in the order `describe` lists them: "cpu", "foreign" (the
// CPU's kernels on memory guarded from the host: a test backend), and "cuda" when built with it.
std::vector<std::string> available_backends();

// Throws Error(kUnsupported) naming what is missing: a backend this binary was built without (and
// how to build it), or a device that is not there; Error(kInvalidInput) for a name no build has.
std::unique_ptr<Backend> make_backend(const std::string& name, const BackendOptions& options);
// The same checks without making the backend: callers run it before the slow part (loading a
// checkpoint), so that a wrong --backend fails at once.
void require_backend(const std::string& name, const BackendOptions& options);

}  // namespace bev
