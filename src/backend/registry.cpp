#include "backend/registry.h"

#include "backend/cpu/onednn.h"
#include "backend/foreign/foreign_backend.h"
#include "bevformer/error.h"

#if BEV_HAVE_CUDA
#include "backend/cuda/device_memory.h"
#endif

namespace bev {
namespace {

std::string listed(const std::vector<std::string>& names) {
  std::string s;
  for (const std::string& n : names) s += (s.empty() ? "" : ", ") + n;
  return s;
}

}  // namespace

std::vector<std::string> available_backends() { return {"cpu", "foreign"}; }

void require_backend(const std::string& name, const BackendOptions& options) {
  if (name == "cpu" || name == "foreign") {
    // Said before any weights load, so that a server refuses at start and never per frame.
    if (options.device != 0) {
      throw Error(ErrorKind::kInvalidInput, "device " + std::to_string(options.device) + " of backend '" + name + "'")
          .expected("device 0: the " + name + " backend runs on this machine's CPU, one device")
          .hint("--device picks a GPU of a device backend (cuda)");
    }
    cpu::require_precision(options.precision);
    return;
  }
  if (name == "cuda") {
    (void)options;
#if BEV_HAVE_CUDA
    const int devices = cuda::device_count();
    if (devices == 0) {
      throw Error(ErrorKind::kUnsupported, "backend 'cuda': no CUDA device is visible to this process")
          .expected("an NVIDIA GPU and its driver")
          .hint("--backend cpu runs everywhere");
    }
    throw Error(ErrorKind::kUnsupported, "backend 'cuda': this build has CUDA device memory (" +
                                             std::to_string(devices) + " device(s) seen) but not the CUDA op kernels yet")
        .expected("one of: " + listed(available_backends()));
#else
    throw Error(ErrorKind::kUnsupported, "backend 'cuda' is not built into this binary")
        .expected("one of: " + listed(available_backends()))
        .hint("configure with -DBEV_CUDA=ON (needs nvcc and the CUDA toolkit in /usr/local/cuda)");
#endif
  }
  throw Error(ErrorKind::kInvalidInput, "unknown backend '" + name + "'").expected("one of: " + listed(available_backends()));
}

std::unique_ptr<Backend> make_backend(const std::string& name, const BackendOptions& options) {
  require_backend(name, options);
  if (name == "cpu") return make_cpu_backend(options.threads, options.precision);
  if (name == "foreign") return make_foreign_backend(options.threads, options.precision);
  throw Error(ErrorKind::kInternal, "backend '" + name + "' passed the registry's checks but has no factory");
}

}  // namespace bev
