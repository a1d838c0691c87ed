// Scaled dot-product attention, the core of nn.MultiheadAttention (the decoder's self-attention):
// for each sample b and head h, with [.., h] the head's hd = C / heads columns,
//   y[b, :, h] = softmax(scale * q[b, :, h] @ k[b, :, h]^T) @ v[b, :, h].
//
// One op instead of batched_matmul + softmax + batched_matmul: as three ops the [heads, Q, K]
// scores went to memory and back four times (f32 scores written, read by softmax, written,
// read again and converted to bf16 for the second product): tiny's decoder self-attention spent
// 6.4 ms of its 7.5 ms per layer there on the AMX Xeon, at 9% of the bf16 peak. Here queries go
// in blocks whose [heads, rows, K] scores stay in cache: per block, one oneDNN matmul for all
// heads' scores (the scale as its output scale, as batched_matmul did), softmax's numerators
// exp(s - max) and row sums (cpu::softmax_numerators), one matmul of the numerators by v, and
// softmax's division applied to those hd context values instead of the K probabilities. Each
// sample's q, k and v are first packed head by head (which also replaces the permutes to and from
// heads); in bf16 when precision is kBF16, where the numerators are rounded to bf16 for the
// second product as PyTorch's autocast rounds the probabilities.
#pragma once

#include "backend/op.h"
#include "core/tensor.h"
#include "core/thread_pool.h"

namespace bev::cpu {

// q: f32 [B, Q, C]; k, v: f32 [B, K, C]; y: f32 [B, Q, C], preallocated, not overlapping an
// input. All contiguous on the host; C a multiple of heads. Calls are serialized per process for
// each sample shape (its plan owns one sample's packed operands and one block's buffers, so a
// batch of any size reuses them).
void attention(const Tensor& q, const Tensor& k, const Tensor& v, int heads, float scale, Tensor& y,
               Precision precision, ThreadPool* pool = nullptr);

// Rows of queries per block for this shape (for tests that want more than one block).
int64_t attention_block_rows(int64_t q_len, int64_t k_len, int heads);

}  // namespace bev::cpu
