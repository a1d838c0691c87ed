// The foreign-memory backend: the CPU backend's kernels on memory the host must not touch, run
// asynchronously and late, as a device runs them. A run on it that gives the CPU backend's bits
// proves that the runtime and the model reach memory only through the Backend interface and wait
// where they must, as a device backend (CUDA) needs:
//   - its tensors are tagged Device::kForeign, which Tensor's host accessors refuse, and their
//     storage pointers are encoded so that even a raw dereference faults; only this backend
//     turns them back into host views, on its queue. Every op input that is host memory (a
//     constant that skipped Backend::upload, a frame input written in place) is an internal
//     error naming the op;
//   - everything but allocation and preparation is issued to one queue that a thread of its own
//     runs (backend.h's contract), optionally `delay_us` late per item: host memory given to
//     write or read_into is touched only when the queue reaches it, so a missing wait reads
//     results that are not there yet, and a frame that does not keep its inputs unchanged until
//     its wait computes on other bits.
#pragma once

#include <memory>

#include "backend/backend.h"

namespace bev {

// delay_us < 0: BEV_FOREIGN_DELAY_US from the environment (default 0: late only as the queue's
// thread happens to be).
std::unique_ptr<Backend> make_foreign_backend(int threads, Precision precision, int delay_us = -1);

}  // namespace bev
