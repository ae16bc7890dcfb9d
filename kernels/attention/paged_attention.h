// Attention over a paged KV cache, on the CPU.
//
// A layer's cache is two tensors over the pool's physical blocks. A
// sequence owns a block table: logical block j (positions [j * block_size,
// (j + 1) * block_size)) lives in physical block table[j]. Query head h
// reads KV head h / (heads / kv_heads) (GQA).
//
// CPU layouts (CUDA caches keep [blocks, block_size, kv_heads, head_dim];
// see cuda_ops.h):
//   K [kv_heads, blocks, head_dim, block_size]: a block's keys along the
//     innermost axis, so one vector load holds one dimension of 16 keys and
//     the scores of 16 keys are head_dim FMAs with no horizontal sums;
//   V [kv_heads, blocks, block_size, head_dim].
// KV heads outermost: a sequence's blocks, mostly allocated in order, are
// then one stream per head that the hardware prefetchers follow.
// Elements are f32, f16, bf16 or int8 (IsCpuKvDType); scores, the softmax
// and all sums are f32. int8 (DType::kI8) keeps an f32 scale, max |x| / 127,
// per token and KV head for K and for V, inside the block: K [kv_heads,
// blocks, head_dim + 4, block_size] (the last 4 byte rows hold the keys'
// scales), V [kv_heads, blocks, block_size, head_dim + 4] (each key's
// values, then its scale).
#ifndef SHARDLM_KERNELS_ATTENTION_PAGED_ATTENTION_H_
#define SHARDLM_KERNELS_ATTENTION_PAGED_ATTENTION_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "core/tensor.h"
#include "kernels/attention/cuda_decode_plan.h"
#include "step/kv_cache.h"

namespace shardlm {

// The tokens of one step, from any number of sequences, each at its own
// position (prefill chunks and decode tokens mixed).
struct AttentionBatch {
  absl::Span<const int32_t> positions;  // [n] position within its sequence.
  absl::Span<const int32_t> token_seq;  // [n] index into block_tables.
  std::vector<absl::Span<const int32_t>> block_tables;  // Per sequence.
  // > 0: sliding-window attention, the token at position p attends to
  // positions (p - window, p] only; blocks wholly before that are not read.
  int64_t window = 0;
  // > 0: every scaled score s is soft-capped to softcap * tanh(s /
  // softcap) before the mask and softmax (Gemma 2). CPU kernels only.
  float softcap = 0;
  // Attention sinks (gpt-oss): empty, or one logit per query head ([heads]
  // of q) that joins each of its rows' softmax denominators as
  // exp(sink) with no value, so that a row may attend to "nothing".
  // PagedAttentionPartial leaves them out (its lse neither): the merge of
  // the parts adds them once (MergeAttention's sinks). CPU kernels only.
  absl::Span<const float> sinks;
  // Context parallel (worker/forward.h): a table entry of -1 is a block
  // another rank of the CP group holds. WriteKv skips the tokens that fall
  // in one and attention the keys; without this, -1 is an error.
  bool remote_blocks = false;
  // The last `padding` sequences pad a batch to a CUDA graph's fixed size
  // (worker/cuda_graphs.h): their tokens attend over their tables as any
  // other's, but WriteKv writes none of their keys and values, so a table
  // may name any block (the kernels only read it).
  int64_t padding = 0;
};

// The CPU cache shapes of one layer (see the layouts above).
Shape KeyCacheShape(int64_t blocks, int64_t block_size, int64_t kv_heads,
                    int64_t head_dim, DType dtype = DType::kF32);
Shape ValueCacheShape(int64_t blocks, int64_t block_size, int64_t kv_heads,
                      int64_t head_dim, DType dtype = DType::kF32);
// Bytes of one KV head's K (or V) in one block: KvHeadBlockBytes
// (step/kv_cache.h).
// Whether the CPU kernels take caches of `t`: f32, f16, bf16 or I8.
bool IsCpuKvDType(DType t);

// Stores the new keys and values of every token at its position, rounded
// to the caches' element type (round to nearest even).
//   k, v: [n, kv_heads, head_dim] f32.
absl::Status WriteKv(const Tensor& k, const Tensor& v,
                     const AttentionBatch& batch, Tensor& k_cache,
                     Tensor& v_cache);

// Causal attention: token i attends to positions [0, positions[i]] of its
// sequence (the last batch.window of them when set), all of which must
// already be in the cache (call WriteKv first).
//   q, out: [n, heads, head_dim] f32.
// Flash-attention style: a tile of one sequence's query tokens (times the
// GQA group's heads, which share every K/V read) meets the context block by
// block with an online softmax, never an n x n score matrix; when a step
// has too few tiles to keep every thread busy (decode), the context is
// split and the partial softmaxes merged (flash-decoding).
absl::Status PagedAttention(const Tensor& q, const Tensor& k_cache,
                            const Tensor& v_cache, const AttentionBatch& batch,
                            float scale, Tensor& out);

// The same over only the keys of the blocks this rank holds
// (batch.remote_blocks), for one rank of a CP group: out is the softmax
// over those keys, and lse ([n, heads] f32) the log of its denominator,
// log sum_j exp(scale q.k_j), over the same keys. A row with none of its
// keys here gets out = 0 and lse = -inf. MergeAttention combines the
// ranks' parts into the softmax over every key.
absl::Status PagedAttentionPartial(const Tensor& q, const Tensor& k_cache,
                                   const Tensor& v_cache,
                                   const AttentionBatch& batch, float scale,
                                   Tensor& out, Tensor& lse);

// Exactly merges P partial attentions of the same queries over disjoint
// key sets (the flash-decoding merge, also used across the splits inside
// PagedAttention): out = sum_p w_p outs[p] / sum_p w_p, w_p = exp(lses[p]
// - max_p lses[p]). Parts whose lse is -inf (no keys) weigh nothing; a
// row with no keys in any part is an error, unless `sinks` (empty, or
// [heads]: AttentionBatch::sinks) gives its head a sink, which joins the
// denominator (sum_p w_p + exp(sink - max)) and makes such a row 0.
//   outs: [P, n, heads, d] f32, lses: [P, n, heads] f32, out: [n, heads, d].
absl::Status MergeAttention(const Tensor& outs, const Tensor& lses, Tensor& out,
                            absl::Span<const float> sinks = {});

}  // namespace shardlm

#endif  // SHARDLM_KERNELS_ATTENTION_PAGED_ATTENTION_H_
