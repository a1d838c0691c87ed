// cpu::attention in bf16 on AMX tiles, fused. Per head and tile of 16 queries, two passes over
// the keys in chunks of 64: the first takes each row's max from the chunk's scores (a tile product
// stored to L1), the second recomputes the scores and makes softmax's numerators exp(scale s -
// scale max), rounded to bf16, with their f32 sums, and multiplies them into v's tiles at once;
// softmax's division is applied to the 32 context values. Scores and numerators never leave L1.
// oneDNN ran the same products per block of 36 queries as two matmul calls that stored, rescaled
// and reloaded every f32 score through L2 (tiny's decoder on the AMX Xeon, `bench_attention`:
// 3.3 ms a layer there, 1.5 ms here; the numerators' exp is now about half of it).
//
// Applies to bf16 arithmetic on AMX, heads of 32 channels (one tile row of bf16: every BEVFormer
// config) and a positive finite scale (so that the max of the scaled scores is the scaled max);
// cpu::attention runs the oneDNN path otherwise. The semantics are the oneDNN path's in bf16: q,
// k, v and the numerators rounded to bf16 (by vcvtneps2bf16: to nearest even, subnormals to zero),
// scores, sums and context accumulated in f32, NaN poisoning its row and head as there.
#pragma once

#include "core/tensor.h"
#include "core/thread_pool.h"

namespace bev::cpu {

// Whether attention_amx runs for heads of c / heads channels at this scale on this machine (AMX
// present, oneDNN not capped below it by ONEDNN_MAX_CPU_ISA, and the kernel given the tile state).
bool attention_amx_applies(int64_t c, int heads, float scale);

// As cpu::attention in bf16, shapes already checked by it (contiguous f32 q [B, Q, C], k and v
// [B, K, C], y [B, Q, C] disjoint from them); attention_amx_applies must hold. Calls for one
// sample shape are serialized (the plan owns one sample's packed operands).
void attention_amx(const Tensor& q, const Tensor& k, const Tensor& v, int heads, float scale, Tensor& y,
                   ThreadPool* pool);

}  // namespace bev::cpu
