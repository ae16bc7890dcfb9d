#include "kernels/attention/latent_attention.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "core/half.h"
#include "gtest/gtest.h"
#include "testing/random_tensors.h"
#include "testing/status.h"

namespace shardlm {
namespace {

using testing_util::IsError;
using testing_util::RandomTensor;

// An entry as a cache of `dtype` stores it (int8: one scale, max |x| / 127,
// over the whole entry), so that the reference measures the kernel.
std::vector<double> Rounded(DType dtype, const float* x, int64_t d) {
  std::vector<double> out(x, x + d);
  float amax = 0;
  for (int64_t e = 0; e < d; ++e) amax = std::max(amax, std::abs(x[e]));
  const float scale = amax / 127.0f;
  const float inv = scale > 0 ? 1.0f / scale : 0.0f;
  for (int64_t e = 0; e < d; ++e) {
    if (dtype == DType::kI8) {
      out[e] = std::clamp(std::nearbyint(x[e] * inv), -127.0f, 127.0f) *
               double{scale};
    }
    if (dtype == DType::kF16) out[e] = Fp16ToFloat(FloatToFp16(x[e]));
    if (dtype == DType::kBF16) out[e] = Bf16ToFloat(FloatToBf16(x[e]));
  }
  return out;
}

// Two sequences (contexts 37 and 5, the last 3 and 5 tokens in the step)
// in shuffled blocks of 4; every head's attention computed from the
// entries directly, in doubles.
void CheckAgainstReference(DType dtype, int64_t window, double tolerance) {
  const int64_t heads = 3, rope = 4, lora = 12, d = rope + lora, bs = 4;
  const std::vector<int64_t> lens = {37, 5}, steps = {3, 5};
  std::vector<int32_t> free(40);
  std::iota(free.begin(), free.end(), 0);
  std::shuffle(free.begin(), free.end(), std::mt19937(3));
  std::vector<std::vector<int32_t>> tables(2);
  std::vector<Tensor> pe, kv;  // Each sequence's entries' parts.
  for (int s = 0; s < 2; ++s) {
    for (int64_t b = 0; b < (lens[s] + bs - 1) / bs; ++b) {
      tables[s].push_back(free.back());
      free.pop_back();
    }
    pe.push_back(RandomTensor({lens[s], rope}, 10 + s));
    kv.push_back(RandomTensor({lens[s], lora}, 20 + s));
  }
  ASSERT_OK_AND_ASSIGN(Tensor cache,
                       Tensor::Host(dtype, LatentCacheShape(40, bs, d, dtype)));
  // Every sequence's context written, one token per call at first (as
  // earlier steps did), then the step's tokens together.
  std::vector<int32_t> pos, seq;
  for (int s = 0; s < 2; ++s) {
    for (int64_t p = 0; p < lens[s]; ++p) {
      pos.push_back(static_cast<int32_t>(p));
      seq.push_back(s);
    }
  }
  AttentionBatch all{.positions = pos, .token_seq = seq, .window = window};
  for (const auto& t : tables) all.block_tables.push_back(t);
  ASSERT_OK_AND_ASSIGN(Tensor first, Tensor::Host(DType::kF32, {42, rope}));
  ASSERT_OK_AND_ASSIGN(Tensor second, Tensor::Host(DType::kF32, {42, lora}));
  std::copy_n(pe[0].f32().data(), 37 * rope, first.f32().data());
  std::copy_n(pe[1].f32().data(), 5 * rope, first.f32().data() + 37 * rope);
  std::copy_n(kv[0].f32().data(), 37 * lora, second.f32().data());
  std::copy_n(kv[1].f32().data(), 5 * lora, second.f32().data() + 37 * lora);
  ASSERT_OK(WriteLatent(first, second, all, cache));

  // The step: the last steps[s] tokens of each sequence.
  std::vector<int32_t> step_pos, step_seq;
  for (int s = 0; s < 2; ++s) {
    for (int64_t p = lens[s] - steps[s]; p < lens[s]; ++p) {
      step_pos.push_back(static_cast<int32_t>(p));
      step_seq.push_back(s);
    }
  }
  AttentionBatch batch{
      .positions = step_pos, .token_seq = step_seq, .window = window};
  for (const auto& t : tables) batch.block_tables.push_back(t);
  const int64_t n = static_cast<int64_t>(step_pos.size());
  const Tensor q = RandomTensor({n, heads, d}, 7);
  ASSERT_OK_AND_ASSIGN(Tensor out, Tensor::Host(DType::kF32, {n, heads, lora}));
  const float scale = 0.37f;
  ASSERT_OK(LatentAttention(q, cache, batch, scale, rope, out));

  double worst = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int s = step_seq[i];
    const int64_t p = step_pos[i];
    const int64_t j0 = window > 0 ? std::max<int64_t>(0, p - window + 1) : 0;
    for (int64_t h = 0; h < heads; ++h) {
      std::vector<double> score, value(lora, 0.0);
      std::vector<std::vector<double>> entries;
      for (int64_t j = j0; j <= p; ++j) {
        std::vector<float> e(d);
        std::copy_n(pe[s].f32().data() + j * rope, rope, e.data());
        std::copy_n(kv[s].f32().data() + j * lora, lora, e.data() + rope);
        entries.push_back(Rounded(dtype, e.data(), d));
        double dot = 0;
        for (int64_t k = 0; k < d; ++k) {
          dot += q.f32()[(i * heads + h) * d + k] * entries.back()[k];
        }
        score.push_back(dot * scale);
      }
      const double mx = *std::max_element(score.begin(), score.end());
      double sum = 0;
      for (double& x : score) sum += (x = std::exp(x - mx));
      for (size_t j = 0; j < entries.size(); ++j) {
        for (int64_t k = 0; k < lora; ++k) {
          value[k] += score[j] / sum * entries[j][rope + k];
        }
      }
      for (int64_t k = 0; k < lora; ++k) {
        worst = std::max(
            worst, std::abs(value[k] - out.f32()[(i * heads + h) * lora + k]));
      }
    }
  }
  EXPECT_LT(worst, tolerance) << DTypeName(dtype) << " window " << window;
}

TEST(LatentAttentionTest, MatchesTheExpandedSoftmaxInEveryCacheType) {
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16, DType::kI8}) {
    CheckAgainstReference(t, /*window=*/0, 1e-5);
  }
}

TEST(LatentAttentionTest, SlidingWindowReadsOnlyItsPositions) {
  CheckAgainstReference(DType::kF32, /*window=*/6, 1e-5);
}

TEST(LatentAttentionTest, RefusesBadCachesAndTables) {
  ASSERT_OK_AND_ASSIGN(
      Tensor cache,
      Tensor::Host(DType::kF32, LatentCacheShape(2, 4, 8, DType::kF32)));
  const Tensor q = RandomTensor({1, 2, 8}, 1);
  ASSERT_OK_AND_ASSIGN(Tensor out, Tensor::Host(DType::kF32, {1, 2, 6}));
  const std::vector<int32_t> pos = {5}, seq = {0}, table = {1, 7};
  AttentionBatch batch{.positions = pos, .token_seq = seq};
  batch.block_tables.push_back(table);
  EXPECT_TRUE(IsError(LatentAttention(q, cache, batch, 1.0f, 2, out),
                      absl::StatusCode::kInvalidArgument,
                      "outside the cache of 2 blocks"));
  const std::vector<int32_t> good = {1, 0};
  batch.block_tables = {good};
  EXPECT_TRUE(IsError(LatentAttention(q, cache, batch, 1.0f, 3, out),
                      absl::StatusCode::kInvalidArgument, "values [3, 9)"));
  batch.remote_blocks = true;
  EXPECT_TRUE(IsError(LatentAttention(q, cache, batch, 1.0f, 2, out),
                      absl::StatusCode::kUnimplemented, "context parallel"));
  ASSERT_OK_AND_ASSIGN(Tensor wrong, Tensor::Host(DType::kF32, {2, 2, 4, 8}));
  batch.remote_blocks = false;
  EXPECT_TRUE(IsError(LatentAttention(q, wrong, batch, 1.0f, 2, out),
                      absl::StatusCode::kInvalidArgument, "cache is"));
}

}  // namespace
}  // namespace shardlm
