// How the CUDA decode attention kernel (PagedAttentionCuda in cuda_ops.h)
// cuts its work, as plain arithmetic: memory sizing, CUDA graph keys and
// tests use it without CUDA.
//
// One block serves one token's query heads that share a KV head (a GQA
// group, or kCudaDecodeHeadsPerBlock of a larger one) over one split of the
// token's context; the splits are merged by a second kernel through an f32
// workspace holding per (token, query head, split) [max, sum, acc[head_dim]].
#ifndef SHARDLM_KERNELS_ATTENTION_CUDA_DECODE_PLAN_H_
#define SHARDLM_KERNELS_ATTENTION_CUDA_DECODE_PLAN_H_

#include <cstdint>

namespace shardlm {

inline constexpr int kMaxCudaDecodeSplits = 64;
inline constexpr int kCudaDecodeHeadsPerBlock = 16;
// A split shorter than this many keys (one of the kernel's 32-key chunks)
// would leave lanes idle.
inline constexpr int kCudaDecodeMinKeysPerSplit = 32;

constexpr int64_t CudaDecodeWorkspaceFloats(int64_t tokens, int64_t heads,
                                            int64_t head_dim, int splits) {
  return splits <= 1 ? 0 : tokens * heads * splits * (head_dim + 2);
}

// Blocks of one split: tokens x KV heads x blocks per GQA group.
constexpr int64_t CudaDecodeBlocks(int64_t tokens, int64_t heads,
                                   int64_t kv_heads) {
  const int64_t group = kv_heads > 0 ? heads / kv_heads : 1;
  return tokens * kv_heads *
         ((group + kCudaDecodeHeadsPerBlock - 1) / kCudaDecodeHeadsPerBlock);
}

// The split count for `tokens` tokens of which the longest attends to `keys`
// positions, on a GPU of `multiprocessors` SMs: about three blocks per SM
// (a decode step of few sequences must still read at full bandwidth), no
// split under kCudaDecodeMinKeysPerSplit keys, 1 to kMaxCudaDecodeSplits.
constexpr int CudaDecodeSplits(int64_t keys, int64_t tokens, int64_t heads,
                               int64_t kv_heads, int64_t multiprocessors) {
  const int64_t blocks = CudaDecodeBlocks(tokens, heads, kv_heads);
  const int64_t fill =
      blocks > 0 ? (3 * multiprocessors + blocks - 1) / blocks : 1;
  const int64_t by_keys =
      (keys + kCudaDecodeMinKeysPerSplit - 1) / kCudaDecodeMinKeysPerSplit;
  const int64_t splits = fill < by_keys ? fill : by_keys;
  return static_cast<int>(splits < 1                      ? 1
                          : splits > kMaxCudaDecodeSplits ? kMaxCudaDecodeSplits
                                                          : splits);
}

}  // namespace shardlm

#endif  // SHARDLM_KERNELS_ATTENTION_CUDA_DECODE_PLAN_H_
