#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "kernels/attention/paged_attention.h"
#include "kernels/check_args.h"
#include "kernels/softmax/softmax.h"

namespace shardlm {
namespace {

// Checks cache shapes and that every token's positions map to valid
// physical blocks.
absl::Status CheckBatch(const AttentionBatch& batch, int64_t n,
                        const Tensor& k_cache, const Tensor& v_cache,
                        int64_t kv_heads, int64_t d) {
  if (k_cache.rank() != 4) {
    return absl::InvalidArgumentError("attention: cache must be 4-D");
  }
  const int64_t blocks = k_cache.dim(0), bs = k_cache.dim(1);
  const Shape cache_shape = {blocks, bs, kv_heads, d};
  RETURN_IF_ERROR(CheckHostF32("attention", "k_cache", k_cache, cache_shape));
  RETURN_IF_ERROR(CheckHostF32("attention", "v_cache", v_cache, cache_shape));
  if (static_cast<int64_t>(batch.positions.size()) != n ||
      static_cast<int64_t>(batch.token_seq.size()) != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("attention: ", n, " tokens but ", batch.positions.size(),
                     " positions and ", batch.token_seq.size(), " seq ids"));
  }
  const int64_t n_seqs = static_cast<int64_t>(batch.block_tables.size());
  for (int64_t i = 0; i < n; ++i) {
    const int32_t s = batch.token_seq[i], pos = batch.positions[i];
    if (s < 0 || s >= n_seqs || pos < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "attention: token ", i, " has sequence ", s, " position ", pos));
    }
    const auto& table = batch.block_tables[s];
    if (static_cast<int64_t>(table.size()) <= pos / bs) {
      return absl::InvalidArgumentError(
          absl::StrCat("attention: sequence ", s, " has ", table.size(),
                       " blocks, position ", pos, " needs ", pos / bs + 1));
    }
  }
  for (const auto& table : batch.block_tables) {
    for (int32_t b : table) {
      if (b < 0 || b >= blocks) {
        return absl::InvalidArgumentError(absl::StrCat(
            "attention: physical block ", b, " outside the pool of ", blocks));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteKv(const Tensor& k, const Tensor& v,
                     const AttentionBatch& batch, Tensor& k_cache,
                     Tensor& v_cache) {
  if (k.rank() != 3) {
    return absl::InvalidArgumentError("WriteKv: k must be [n, kv_heads, d]");
  }
  const int64_t n = k.dim(0), kv_heads = k.dim(1), d = k.dim(2);
  RETURN_IF_ERROR(CheckHostF32("WriteKv", "k", k, {n, kv_heads, d}));
  RETURN_IF_ERROR(CheckHostF32("WriteKv", "v", v, {n, kv_heads, d}));
  RETURN_IF_ERROR(CheckBatch(batch, n, k_cache, v_cache, kv_heads, d));
  const int64_t bs = k_cache.dim(1);
  const int64_t row = kv_heads * d;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t pos = batch.positions[i];
    const int64_t block = batch.block_tables[batch.token_seq[i]][pos / bs];
    const int64_t slot = block * bs + pos % bs;
    std::memcpy(k_cache.data<float>() + slot * row, k.data<float>() + i * row,
                row * sizeof(float));
    std::memcpy(v_cache.data<float>() + slot * row, v.data<float>() + i * row,
                row * sizeof(float));
  }
  return absl::OkStatus();
}

absl::Status PagedAttention(const Tensor& q, const Tensor& k_cache,
                            const Tensor& v_cache, const AttentionBatch& batch,
                            float scale, Tensor& out) {
  if (q.rank() != 3 || k_cache.rank() != 4) {
    return absl::InvalidArgumentError(
        "PagedAttention: q must be [n, heads, d], caches 4-D");
  }
  const int64_t n = q.dim(0), heads = q.dim(1), d = q.dim(2);
  const int64_t kv_heads = k_cache.dim(2);
  RETURN_IF_ERROR(CheckHostF32("PagedAttention", "q", q, {n, heads, d}));
  RETURN_IF_ERROR(CheckHostF32("PagedAttention", "out", out, {n, heads, d}));
  if (kv_heads <= 0 || heads % kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("PagedAttention: ", heads,
                                                   " query heads over ",
                                                   kv_heads, " KV heads"));
  }
  RETURN_IF_ERROR(CheckBatch(batch, n, k_cache, v_cache, kv_heads, d));
  const int64_t bs = k_cache.dim(1);
  const int64_t group = heads / kv_heads;
  const float* kc = k_cache.data<float>();
  const float* vc = v_cache.data<float>();

#pragma omp parallel
  {
    std::vector<float> scores;
#pragma omp for collapse(2) schedule(dynamic, 1)
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t ctx = batch.positions[i] + 1;
        const auto& table = batch.block_tables[batch.token_seq[i]];
        const int64_t kvh = h / group;
        const float* qi = q.data<float>() + (i * heads + h) * d;
        scores.resize(ctx);
        for (int64_t j = 0; j < ctx; ++j) {
          const int64_t slot = table[j / bs] * bs + j % bs;
          const float* kj = kc + (slot * kv_heads + kvh) * d;
          float dot = 0;
          for (int64_t e = 0; e < d; ++e) dot += qi[e] * kj[e];
          scores[j] = dot * scale;
        }
        SoftmaxInPlace(scores.data(), ctx);
        float* oi = out.data<float>() + (i * heads + h) * d;
        std::fill(oi, oi + d, 0.0f);
        for (int64_t j = 0; j < ctx; ++j) {
          const int64_t slot = table[j / bs] * bs + j % bs;
          const float* vj = vc + (slot * kv_heads + kvh) * d;
          const float p = scores[j];
          for (int64_t e = 0; e < d; ++e) oi[e] += p * vj[e];
        }
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace shardlm
