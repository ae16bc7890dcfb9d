// Attention over a paged KV cache.
//
// The cache of one layer is two tensors [num_blocks, block_size, kv_heads,
// head_dim]. A sequence owns a block table: logical block j (positions
// [j * block_size, (j + 1) * block_size)) lives in physical block
// table[j]. Query head h reads KV head h / (heads / kv_heads) (GQA).
#ifndef SHARDLM_KERNELS_ATTENTION_PAGED_ATTENTION_H_
#define SHARDLM_KERNELS_ATTENTION_PAGED_ATTENTION_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "core/tensor.h"

namespace shardlm {

// The tokens of one step, from any number of sequences, each at its own
// position (prefill chunks and decode tokens mixed).
struct AttentionBatch {
  absl::Span<const int32_t> positions;  // [n] position within its sequence.
  absl::Span<const int32_t> token_seq;  // [n] index into block_tables.
  std::vector<absl::Span<const int32_t>> block_tables;  // Per sequence.
};

// Stores the new keys and values of every token at its position.
//   k, v: [n, kv_heads, head_dim]  k_cache, v_cache: [blocks, bs, kv_heads,
//   head_dim]
absl::Status WriteKv(const Tensor& k, const Tensor& v,
                     const AttentionBatch& batch, Tensor& k_cache,
                     Tensor& v_cache);

// Causal attention: token i attends to positions [0, positions[i]] of its
// sequence, all of which must already be in the cache (call WriteKv first).
//   q, out: [n, heads, head_dim]
absl::Status PagedAttention(const Tensor& q, const Tensor& k_cache,
                            const Tensor& v_cache, const AttentionBatch& batch,
                            float scale, Tensor& out);

}  // namespace shardlm

#endif  // SHARDLM_KERNELS_ATTENTION_PAGED_ATTENTION_H_
