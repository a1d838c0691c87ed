// The small glue around deformable attention and the head's box refinement, each one pass over
// rows that upstream spells as several PyTorch ops (division, broadcast add, sigmoid, slicing).
// Fusing them keeps those intermediates out of the plan; the arithmetic is the same float32
// operations in the same order as upstream, so results are bit-identical to PyTorch's CPU f32.
// Every tensor is contiguous host f32; every shape is checked and a mismatch throws
// Error(kInvalidInput) naming the tensor. `pool` is optional: null runs on the caller.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "backend/op.h"
#include "core/tensor.h"
#include "core/thread_pool.h"

namespace bev::cpu {

// Sampling locations of deformable attention (spec §2.9, §2.11, §2.12; upstream's
// `sampling_offsets / offset_normalizer[None, None, None, :, None, :]` then
// `reference_points + sampling_offsets`, the points viewed as (P / R, R) so point p uses anchor
// p % R):
//   out[m, h, l, p, 0] = ref[m, l', p % R, 0] + off[m, h, l, p, 0] / float(W_l)
//   out[m, h, l, p, 1] = ref[m, l', p % R, 1] + off[m, h, l, p, 1] / float(H_l)
// with l' = 0 when Lr = 1, else l. True division (not a multiply by 1 / W_l, which rounds
// differently), then the add: PyTorch's order. offsets [M, heads, L, P, 2], reference
// [M, Lr, R, D] with Lr = 1 or L, R dividing P, D >= 2 (only x, y are read), spatial_shapes
// (H_l, W_l) per level, all >= 1; out [M, heads, L, P, 2] may be offsets itself (in place) but
// must not overlap reference. Split over M across the pool.
void sampling_locations(const Tensor& offsets, const Tensor& reference,
                        const std::vector<std::pair<int64_t, int64_t>>& spatial_shapes, Tensor& out,
                        ThreadPool* pool = nullptr);

// The same over rows [m0, m1) of raw contiguous tensors (offsets and out [M, heads, L, P, 2],
// reference [M, lr, r_len, d_len]), unchecked, on the calling thread: for ops that make the
// offsets of a chunk of rows themselves (cpu::deformable_attention). Same bits.
void sampling_locations_rows(const float* offsets, const float* reference, int64_t lr, int64_t r_len, int64_t d_len,
                             int64_t heads, int64_t points, const std::vector<std::pair<int64_t, int64_t>>& spatial_shapes,
                             float* out, int64_t m0, int64_t m1);

// The decoder's box refinement (spec §2.11; upstream `new_reference_points[..., :2] = tmp[..., :2]
// + inverse_sigmoid(reference_points[..., :2])`, `[..., 2:3] = tmp[..., 4:5] + inverse_sigmoid(
// reference_points[..., 2:3])`, then `.sigmoid()`):
//   out[m, k] = sigmoid(reg[m, c_k] + inverse_sigmoid(ref[m, k])),  (c_0, c_1, c_2) = (0, 1, 4)
// with sigmoid_scalar and inverse_sigmoid_scalar (eps 1e-5) of elementwise.h, so it agrees bit
// for bit with the unfused ops. reg [M, code >= 5], reference [M, 3]; out [M, 3] may be
// reference itself (in place) but must not overlap reg.
void reference_refine(const Tensor& reg, const Tensor& reference, Tensor& out, ThreadPool* pool = nullptr);

// The head's boxes in metres (spec §2.13; upstream `tmp[..., 0:1] * (pc_range[3] - pc_range[0])
// + pc_range[0]` and likewise for y, z): out = reg, then
//   out[m, 0] = refined[m, 0] * scale[0] + offset[0]
//   out[m, 1] = refined[m, 1] * scale[1] + offset[1]
//   out[m, 4] = refined[m, 2] * scale[2] + offset[2]
// each a float multiply then a float add, two roundings (the build does not contract them into
// an FMA: -std=c++20 implies -ffp-contract=off, and x86-64 without -march has no FMA anyway).
// reg [M, code >= 5], refined [M, 3]; out [M, code] may be reg itself (in place) but must not
// overlap refined.
void bbox_denormalize(const Tensor& reg, const Tensor& refined, const BboxDenormalizeAttrs& attrs, Tensor& out,
                      ThreadPool* pool = nullptr);

}  // namespace bev::cpu
