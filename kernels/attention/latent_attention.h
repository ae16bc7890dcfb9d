// Multi-head latent attention (DeepSeek V2/V3, Kimi K2) over a paged cache
// of one entry per token, on the CPU.
//
// Each token caches, per layer, one entry of d values shared by every
// head: [k_pe (the roped key part, rope_dims) | c_kv (the normed latent,
// kv_lora_rank)]. The heads' queries come absorbed ([q_pe | W_kb^T q_nope],
// d values each: worker/forward.cc), so a head's score is one dot product
// with the entry, and its output is the softmax-weighted sum of the
// entries' values [value_offset, value_offset + value_dim) (c_kv), which
// the caller projects through W_vb. This is MQA with K = the entry and V =
// a part of it: the cache holds each token once, for all heads (576 values
// for DeepSeek V3, against 2 x 128 x 192 for its heads expanded).
//
// Layout: [1, blocks, block_size, d] (ValueCacheShape with one KV head: a
// token's entry is contiguous), f32, f16, bf16 or int8 (int8: d + 4 bytes
// per token, the last 4 its f32 scale, max |x| / 127 over the entry).
#ifndef SHARDLM_KERNELS_ATTENTION_LATENT_ATTENTION_H_
#define SHARDLM_KERNELS_ATTENTION_LATENT_ATTENTION_H_

#include <cstdint>

#include "absl/status/status.h"
#include "core/tensor.h"
#include "kernels/attention/paged_attention.h"

namespace shardlm {

// The cache of one layer: `blocks` blocks of `block_size` entries of `dim`.
Shape LatentCacheShape(int64_t blocks, int64_t block_size, int64_t dim,
                       DType dtype);

// Stores entry [first | second] of every token at its position, rounded to
// the cache's element type. first: [n, a], second: [n, b] f32, a + b = d.
absl::Status WriteLatent(const Tensor& first, const Tensor& second,
                         const AttentionBatch& batch, Tensor& cache);

// Causal attention (the last batch.window positions when set) of every
// head of every token over its sequence's entries, all of which must be in
// the cache: out[i, h] = sum_j softmax_j(scale q[i, h] . e_j) e_j[value_
// offset, value_offset + value_dim).
//   q: [n, heads, d] f32, out: [n, heads, value_dim] f32.
// Context parallel (batch.remote_blocks) is not built for it.
absl::Status LatentAttention(const Tensor& q, const Tensor& cache,
                             const AttentionBatch& batch, float scale,
                             int64_t value_offset, Tensor& out);

}  // namespace shardlm

#endif  // SHARDLM_KERNELS_ATTENTION_LATENT_ATTENTION_H_
