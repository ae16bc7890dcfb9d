#include "worker/activation_memory.h"

#include "kernels/attention/paged_attention.h"

namespace shardlm {

RankActivationDims ActivationDimsOf(const ModelConfig& config,
                                    const ShardSpec& spec) {
  return {.hidden = config.hidden,
          .heads = spec.n_heads(),
          .kv_heads = spec.n_kv_heads(),
          .head_dim = config.head_dim,
          .ffn = spec.ffn_end - spec.ffn_begin,
          .vocab_padded = spec.vocab_padded,
          .tp = spec.tp_size,
          .last_stage = spec.last_stage()};
}

// Buffer for buffer as CudaModelRunner::Reserve allocates them; change both
// together.
int64_t GpuActivationBytes(const RankActivationDims& d, int64_t tokens,
                           int64_t rows) {
  constexpr int64_t kF32 = 4, kBf16 = 2, kI32 = 4;
  const int64_t q_dim = d.heads * d.head_dim;
  const int64_t kv_dim = d.kv_heads * d.head_dim;
  int64_t per_token = kI32                                   // ids
                      + kF32 * d.hidden                      // x
                      + kF32 * (q_dim + 2 * kv_dim)          // q, k, v
                      + kF32 * (q_dim + 2 * kv_dim)          // fused qkv
                      + kF32 * 2 * d.ffn                     // fused gate/up
                      + kBf16 * (d.hidden + q_dim + d.ffn);  // GEMM inputs
  if (d.tp > 1) per_token += kF32 * d.hidden;                // TP partial sums.
  int64_t per_row = 2 * kI32;  // Row indices, sampled ids.
  if (d.last_stage) {
    per_row += kF32 * d.hidden + kBf16 * d.hidden + kF32 * d.vocab_padded;
    if (d.tp > 1) per_row += kF32 * d.tp * d.vocab_padded;  // The gather.
  }
  const int64_t workspace =
      kF32 * CudaDecodeWorkspaceFloats(rows, d.heads, d.head_dim,
                                       kMaxCudaDecodeSplits);
  return tokens * per_token + rows * per_row + workspace;
}

}  // namespace shardlm
