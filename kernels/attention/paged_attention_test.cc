#include "kernels/attention/paged_attention.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/test_util.h"

namespace shardlm {
namespace {

using testing_util::RandomTensor;

// Two sequences with contiguous K/V [len, kv_heads, d] as ground truth,
// scattered into a pool through shuffled block tables.
struct Fixture {
  static constexpr int64_t kBs = 16, kBlocks = 24, kKvHeads = 3, kD = 64;
  std::vector<Tensor> k, v;  // Per sequence, contiguous.
  std::vector<std::vector<int32_t>> tables;
  Tensor k_cache = *Tensor::Host(DType::kF32, {kBlocks, kBs, kKvHeads, kD});
  Tensor v_cache = *Tensor::Host(DType::kF32, {kBlocks, kBs, kKvHeads, kD});

  explicit Fixture(std::vector<int64_t> lens) {
    std::vector<int32_t> free(kBlocks);
    std::iota(free.begin(), free.end(), 0);
    std::shuffle(free.begin(), free.end(), std::mt19937(5));
    for (size_t s = 0; s < lens.size(); ++s) {
      k.push_back(RandomTensor({lens[s], kKvHeads, kD}, 10 + s));
      v.push_back(RandomTensor({lens[s], kKvHeads, kD}, 20 + s));
      std::vector<int32_t> table;
      for (int64_t b = 0; b < (lens[s] + kBs - 1) / kBs; ++b) {
        table.push_back(free.back());
        free.pop_back();
      }
      tables.push_back(table);
    }
  }
};

// Naive causal attention of one query row over positions [0, pos].
std::vector<double> Reference(const float* q, const Tensor& k, const Tensor& v,
                              int64_t kvh, int64_t pos, double scale) {
  const int64_t kv_heads = k.dim(1), d = k.dim(2);
  std::vector<double> s(pos + 1), out(d, 0.0);
  double max = -INFINITY, sum = 0;
  for (int64_t j = 0; j <= pos; ++j) {
    double dot = 0;
    for (int64_t e = 0; e < d; ++e) {
      dot += q[e] * double{k.f32()[(j * kv_heads + kvh) * d + e]};
    }
    s[j] = dot * scale;
    max = std::max(max, s[j]);
  }
  for (double& x : s) sum += (x = std::exp(x - max));
  for (int64_t j = 0; j <= pos; ++j) {
    for (int64_t e = 0; e < d; ++e) {
      out[e] += s[j] / sum * v.f32()[(j * kv_heads + kvh) * d + e];
    }
  }
  return out;
}

// A mixed step: sequence 0 prefills positions [0, 37) in one chunk while
// sequence 1 (already holding 70 tokens) decodes position 70. 9 query heads
// over 3 KV heads, as in SmolLM2.
TEST(PagedAttentionTest, MixedPrefillAndDecodeMatchNaiveAttention) {
  Fixture f({37, 71});
  std::vector<int32_t> positions, token_seq;
  for (int32_t p = 0; p < 37; ++p) {
    positions.push_back(p);
    token_seq.push_back(0);
  }
  positions.push_back(70);
  token_seq.push_back(1);
  AttentionBatch batch{.positions = positions,
                       .token_seq = token_seq,
                       .block_tables = {f.tables[0], f.tables[1]}};
  const int64_t n = positions.size(), heads = 9, d = Fixture::kD;

  // Gather each token's new K/V from the ground truth and write it; the
  // decode sequence's earlier 70 tokens are written by a first step.
  std::vector<int32_t> hist_pos(70), hist_seq(70, 0);
  std::iota(hist_pos.begin(), hist_pos.end(), 0);
  AttentionBatch hist{.positions = hist_pos,
                      .token_seq = hist_seq,
                      .block_tables = {f.tables[1]}};
  Tensor hk = *Tensor::View(DType::kF32, {70, 3, d}, f.k[1].raw());
  Tensor hv = *Tensor::View(DType::kF32, {70, 3, d}, f.v[1].raw());
  ASSERT_TRUE(WriteKv(hk, hv, hist, f.k_cache, f.v_cache).ok());

  Tensor nk = *Tensor::Host(DType::kF32, {n, 3, d});
  Tensor nv = *Tensor::Host(DType::kF32, {n, 3, d});
  for (int64_t i = 0; i < n; ++i) {
    const Tensor& sk = f.k[token_seq[i]];
    const Tensor& sv = f.v[token_seq[i]];
    std::copy_n(sk.f32().data() + positions[i] * 3 * d, 3 * d,
                nk.f32().data() + i * 3 * d);
    std::copy_n(sv.f32().data() + positions[i] * 3 * d, 3 * d,
                nv.f32().data() + i * 3 * d);
  }
  ASSERT_TRUE(WriteKv(nk, nv, batch, f.k_cache, f.v_cache).ok());

  Tensor q = RandomTensor({n, heads, d}, 3);
  Tensor out = *Tensor::Host(DType::kF32, {n, heads, d});
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  ASSERT_TRUE(PagedAttention(q, f.k_cache, f.v_cache, batch, scale, out).ok());

  double max_err = 0;
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t h = 0; h < heads; ++h) {
      const auto want =
          Reference(q.f32().data() + (i * heads + h) * d, f.k[token_seq[i]],
                    f.v[token_seq[i]], h / 3, positions[i], scale);
      max_err =
          std::max(max_err, MaxAbsDiff(out.f32().data() + (i * heads + h) * d,
                                       want.data(), static_cast<size_t>(d)));
    }
  }
  EXPECT_LT(max_err, 1e-5);
}

TEST(PagedAttentionTest, RejectsBadBlockTables) {
  Fixture f({20});
  const std::vector<int32_t> positions = {19}, token_seq = {0};
  const std::vector<int32_t> short_table = {f.tables[0][0]};
  const std::vector<int32_t> bad_block = {0, Fixture::kBlocks};
  Tensor q = RandomTensor({1, 3, Fixture::kD}, 1);
  Tensor out = *Tensor::Host(DType::kF32, {1, 3, Fixture::kD});
  for (const auto& table : {short_table, bad_block}) {
    AttentionBatch batch{.positions = positions,
                         .token_seq = token_seq,
                         .block_tables = {table}};
    EXPECT_EQ(PagedAttention(q, f.k_cache, f.v_cache, batch, 1.0f, out).code(),
              absl::StatusCode::kInvalidArgument);
  }
  const std::vector<int32_t> bad_seq = {1};
  AttentionBatch batch{.positions = positions,
                       .token_seq = bad_seq,
                       .block_tables = {f.tables[0]}};
  EXPECT_FALSE(PagedAttention(q, f.k_cache, f.v_cache, batch, 1.0f, out).ok());
}

}  // namespace
}  // namespace shardlm
