// A post-norm transformer layer's FFN, residual and norm as one op (Ops::ffn_norm; mmcv FFN and
// the layer's norms.2): y = layer_norm(x + fc2(relu(fc1(x)))). Per chunk of rows a pool
// participant runs fc1 into its own scratch (the hidden rows, bf16 in bf16 arithmetic), fc2 from
// there into y, and the residual sum and norm over those rows of y while they are in cache: as
// three ops base's hidden map (41 MB in bf16) and the FFN's output (41 MB) went through memory
// and back.
//
// Each step is the op-by-op path's own code on a chunk of rows (Linear::RowRunner,
// layer_norm_rows), so y has the bits of the ops one by one (the tests compare them).
#pragma once

#include "backend/op.h"
#include "core/tensor.h"
#include "core/thread_pool.h"

namespace bev::cpu {

// x [M, C] f32 contiguous; gamma, beta [C] f32; y [M, C] f32, contiguous, preallocated, disjoint
// from x. Shapes are checked (Error(kInvalidInput)).
void ffn_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, const FfnNormAttrs& attrs, Tensor& y,
              ThreadPool& pool);

}  // namespace bev::cpu
