// Context parallel attention (issue #35 part 2): each rank of a CP group
// attends over the keys of the blocks it holds (PagedAttentionPartial),
// and MergeAttention combines the parts by their log-sum-exp. Both are
// checked against a direct softmax in double precision, with awkward key
// counts split 1:3 and 3:1 over two parts (a part may hold no key at all).
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/attention/paged_attention.h"
#include "kernels/cpu_isa_testing.h"
#include "testing/random_tensors.h"
#include "testing/status.h"

namespace shardlm {
namespace {

using testing_util::RandomTensor;

constexpr double kNegInf = -std::numeric_limits<double>::infinity();
constexpr int64_t kHeads = 4, kKvHeads = 2, kD = 40, kBs = 16;
constexpr float kScale = 0.6f;

// softmax(scale q.k_j) v_j over keys [k0, k1) of one (query, head), in
// double; lse = log sum_j exp(scale q.k_j) (-inf when the range is empty).
// With a sink (not -inf), exp(sink) joins the denominator (lse too).
void Direct(const float* q, const Tensor& k, const Tensor& v, int64_t kvh,
            int64_t k0, int64_t k1, std::vector<double>& out, double& lse,
            double sink = kNegInf) {
  out.assign(kD, 0.0);
  lse = kNegInf;
  if (k0 >= k1) return;
  std::vector<double> s(k1 - k0);
  for (int64_t j = k0; j < k1; ++j) {
    const float* kj = k.f32().data() + (j * kKvHeads + kvh) * kD;
    double dot = 0;
    for (int64_t e = 0; e < kD; ++e) dot += double{q[e]} * kj[e];
    s[j - k0] = kScale * dot;
  }
  const double m = std::max(*std::max_element(s.begin(), s.end()), sink);
  double l = sink == kNegInf ? 0.0 : std::exp(sink - m);
  for (int64_t j = k0; j < k1; ++j) {
    const double w = std::exp(s[j - k0] - m);
    l += w;
    const float* vj = v.f32().data() + (j * kKvHeads + kvh) * kD;
    for (int64_t e = 0; e < kD; ++e) out[e] += w * vj[e];
  }
  for (double& x : out) x /= l;
  lse = m + std::log(l);
}

// MergeAttention of two parts computed directly over keys [0, split) and
// [split, keys) equals the softmax over all of them.
TEST(AttentionMergeTest, MergeEqualsDirectSoftmax) {
  for (int64_t keys : {1, 15, 16, 17, 4097}) {
    for (int quarter : {1, 3}) {
      const int64_t split = keys * quarter / 4;  // 1:3 or 3:1.
      SCOPED_TRACE(testing::Message() << keys << " keys split at " << split);
      const Tensor q = RandomTensor({1, kHeads, kD}, 1);
      const Tensor k = RandomTensor({keys, kKvHeads, kD}, 2, 2.0f);
      const Tensor v = RandomTensor({keys, kKvHeads, kD}, 3);
      Tensor outs = *Tensor::Host(DType::kF32, {2, 1, kHeads, kD});
      Tensor lses = *Tensor::Host(DType::kF32, {2, 1, kHeads});
      Tensor out = *Tensor::Host(DType::kF32, {1, kHeads, kD});
      std::vector<double> want(kHeads * kD), part;
      for (int64_t h = 0; h < kHeads; ++h) {
        const float* qh = q.f32().data() + h * kD;
        const int64_t kvh = h / (kHeads / kKvHeads);
        double lse;
        for (int p = 0; p < 2; ++p) {
          Direct(qh, k, v, kvh, p == 0 ? 0 : split, p == 0 ? split : keys, part,
                 lse);
          lses.f32()[p * kHeads + h] = static_cast<float>(lse);
          for (int64_t e = 0; e < kD; ++e) {
            outs.f32()[(p * kHeads + h) * kD + e] = static_cast<float>(part[e]);
          }
        }
        Direct(qh, k, v, kvh, 0, keys, part, lse);
        std::copy(part.begin(), part.end(), want.begin() + h * kD);
      }
      ASSERT_OK(MergeAttention(outs, lses, out));
      for (int64_t i = 0; i < kHeads * kD; ++i) {
        ASSERT_NEAR(out.f32()[i], want[i], 2e-6) << "element " << i;
      }
    }
  }
}

TEST(AttentionMergeTest, RejectsARowWithNoKeys) {
  Tensor outs = *Tensor::Host(DType::kF32, {2, 1, 1, 8});
  Tensor lses = *Tensor::Host(DType::kF32, {2, 1, 1});
  Tensor out = *Tensor::Host(DType::kF32, {1, 1, 8});
  std::fill(lses.f32().begin(), lses.f32().end(),
            -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(testing_util::IsError(MergeAttention(outs, lses, out),
                                    absl::StatusCode::kInvalidArgument,
                                    "no key in any"));
}

// Two CP ranks over a paged cache of their own: each writes only the
// tokens of its blocks (the others are -1 in its table) and attends over
// them; the merged result is the softmax over every key. Blocks split in
// contiguous ranges 1:3 and 3:1, and interleaved (block i on rank i mod 2);
// queries: the last token (decode) and the last 20 (a prefill chunk); with
// and without attention sinks (given to both ranks' partial attention,
// which must leave them to the merge, which must count them once). On
// every ISA's attention kernels.
class PartialAttentionTest : public testing::TestWithParam<CpuIsa>,
                             public OnCpuIsa {
 protected:
  void SetUp() override { Use(GetParam()); }
};

TEST_P(PartialAttentionTest, OverTwoRanksEqualsTheSoftmaxOverAllKeys) {
  enum Layout { kQuarter, kThreeQuarters, kInterleaved };
  // Of the scores' size (|0.6 q.k| reaches ~10 here): they matter.
  const std::vector<float> some_sinks = {1.5f, -0.5f, 6.0f, 0.25f};
  for (const bool with_sinks : {false, true})
    for (int64_t keys : {1, 15, 16, 17, 4097}) {
      for (Layout layout : {kQuarter, kThreeQuarters, kInterleaved}) {
        for (int64_t queries : {int64_t{1}, std::min<int64_t>(keys, 20)}) {
          SCOPED_TRACE(testing::Message()
                       << keys << " keys, layout " << layout << ", " << queries
                       << " queries" << (with_sinks ? ", sinks" : ""));
          const absl::Span<const float> sinks =
              with_sinks ? absl::MakeConstSpan(some_sinks)
                         : absl::Span<const float>();
          const int64_t nb = (keys + kBs - 1) / kBs;
          const Tensor k = RandomTensor({keys, kKvHeads, kD}, 4, 2.0f);
          const Tensor v = RandomTensor({keys, kKvHeads, kD}, 5);
          const Tensor q = RandomTensor({queries, kHeads, kD}, 6);
          // A shuffled table over a pool of nb blocks.
          std::vector<int32_t> table(nb);
          std::iota(table.begin(), table.end(), 0);
          std::shuffle(table.begin(), table.end(), std::mt19937(7));
          const auto owner = [&](int64_t j) -> int {
            switch (layout) {
              case kQuarter:
                return j < (nb + 2) / 4 ? 0 : 1;
              case kThreeQuarters:
                return j < (3 * nb + 2) / 4 ? 0 : 1;
              default:
                return static_cast<int>(j % 2);
            }
          };
          std::vector<int32_t> all(keys), seq(keys, 0), qpos, qseq(queries, 0);
          std::iota(all.begin(), all.end(), 0);
          for (int64_t i = keys - queries; i < keys; ++i) qpos.push_back(i);
          Tensor outs = *Tensor::Host(DType::kF32, {2, queries, kHeads, kD});
          Tensor lses = *Tensor::Host(DType::kF32, {2, queries, kHeads});
          for (int r = 0; r < 2; ++r) {
            std::vector<int32_t> mine(nb);
            for (int64_t j = 0; j < nb; ++j) {
              mine[j] = owner(j) == r ? table[j] : -1;
            }
            Tensor kc = *Tensor::Host(DType::kF32,
                                      KeyCacheShape(nb, kBs, kKvHeads, kD));
            Tensor vc = *Tensor::Host(DType::kF32,
                                      ValueCacheShape(nb, kBs, kKvHeads, kD));
            AttentionBatch write{.positions = all,
                                 .token_seq = seq,
                                 .block_tables = {mine},
                                 .remote_blocks = true};
            ASSERT_OK(WriteKv(k, v, write, kc, vc));
            AttentionBatch read{.positions = qpos,
                                .token_seq = qseq,
                                .block_tables = {mine},
                                .sinks = sinks,
                                .remote_blocks = true};
            Tensor out = *outs.Rows(r, r + 1)->Reshaped({queries, kHeads, kD});
            Tensor lse = *lses.Rows(r, r + 1)->Reshaped({queries, kHeads});
            ASSERT_OK(PagedAttentionPartial(q, kc, vc, read, kScale, out, lse));
          }
          Tensor out = *Tensor::Host(DType::kF32, {queries, kHeads, kD});
          ASSERT_OK(MergeAttention(outs, lses, out, sinks));
          std::vector<double> want;
          double lse;
          for (int64_t t = 0; t < queries; ++t) {
            for (int64_t h = 0; h < kHeads; ++h) {
              const float* qh = q.f32().data() + (t * kHeads + h) * kD;
              Direct(qh, k, v, h / (kHeads / kKvHeads), 0, qpos[t] + 1, want,
                     lse, with_sinks ? double{some_sinks[h]} : kNegInf);
              for (int64_t e = 0; e < kD; ++e) {
                ASSERT_NEAR(out.f32()[(t * kHeads + h) * kD + e], want[e], 1e-5)
                    << "query " << t << " head " << h << " element " << e;
              }
            }
          }
        }
      }
    }
}

INSTANTIATE_TEST_SUITE_P(Isas, PartialAttentionTest,
                         testing::ValuesIn(TestIsas()), [](const auto& info) {
                           return std::string(CpuIsaName(info.param));
                         });

// Without remote_blocks, a -1 in a table is still an error.
TEST(AttentionMergeTest, MinusOneNeedsRemoteBlocks) {
  const Tensor k = RandomTensor({1, kKvHeads, kD}, 1);
  Tensor kc = *Tensor::Host(DType::kF32, KeyCacheShape(2, kBs, kKvHeads, kD));
  Tensor vc = *Tensor::Host(DType::kF32, ValueCacheShape(2, kBs, kKvHeads, kD));
  std::vector<int32_t> pos = {0}, seq = {0}, table = {-1};
  AttentionBatch b{.positions = pos, .token_seq = seq, .block_tables = {table}};
  EXPECT_TRUE(testing_util::IsError(WriteKv(k, k, b, kc, vc),
                                    absl::StatusCode::kInvalidArgument,
                                    "outside the pool"));
}

}  // namespace
}  // namespace shardlm
