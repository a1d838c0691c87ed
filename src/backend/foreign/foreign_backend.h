// The foreign-memory backend: the CPU backend's kernels on memory the host must not touch. Its
// tensors are tagged Device::kForeign, which Tensor's host accessors refuse, and their storage
// pointers are encoded so that even a raw dereference faults. Only this backend turns them back
// into host views, inside run/execute/write/read/copy. A run on it that gives the CPU backend's
// bits proves that the runtime and the model reach memory only through the Backend interface,
// as a device backend (CUDA) needs; every op input that is host memory (a constant that skipped
// Backend::upload, a frame input written in place) is an internal error naming the op.
#pragma once

#include <memory>

#include "backend/backend.h"

namespace bev {

std::unique_ptr<Backend> make_foreign_backend(int threads, Precision precision);

}  // namespace bev
