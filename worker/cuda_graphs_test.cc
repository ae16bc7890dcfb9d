#include "worker/cuda_graphs.h"

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace shardlm {
namespace {

TEST(GraphBatchSizeTest, PowersOfTwoThenMultiplesOfEight) {
  const std::vector<std::pair<int64_t, int64_t>> want = {
      {1, 1},  {2, 2},   {3, 4},   {4, 4},     {5, 8},    {8, 8},
      {9, 16}, {16, 16}, {17, 24}, {250, 256}, {256, 256}};
  for (const auto& [n, size] : want) EXPECT_EQ(GraphBatchSize(n), size) << n;
  EXPECT_EQ(GraphBatchSize(0), 0);
  EXPECT_EQ(GraphBatchSize(kMaxGraphBatch + 1), 0);
  // Every size is at least n, wastes at most 7 rows from 8 on, and there
  // are few of them.
  std::vector<int64_t> sizes;
  for (int64_t n = 1; n <= kMaxGraphBatch; ++n) {
    const int64_t size = GraphBatchSize(n);
    ASSERT_GE(size, n);
    if (n >= 8) {
      ASSERT_LE(size - n, 7) << n;
    }
    if (sizes.empty() || sizes.back() != size) sizes.push_back(size);
  }
  EXPECT_EQ(sizes.size(), 35u);
}

StepInput Decode(int n) {
  StepInput s;
  for (int i = 0; i < n; ++i) {
    s.tokens.push_back(100 + i);
    s.positions.push_back(20 * i + 3);
    s.token_seq.push_back(i);
    s.block_tables.push_back({2 * i + 1, 2 * i + 2});
    s.logit_rows.push_back(i);
  }
  return s;
}

TEST(IsDecodeStepTest, OneTokenPerSequenceEachALogitRow) {
  EXPECT_TRUE(IsDecodeStep(Decode(1)));
  EXPECT_TRUE(IsDecodeStep(Decode(5)));
  EXPECT_FALSE(IsDecodeStep(StepInput{}));
  StepInput prefill = Decode(1);  // Two tokens of one sequence.
  prefill.tokens.push_back(7);
  prefill.positions.push_back(4);
  prefill.token_seq.push_back(0);
  prefill.logit_rows = {1};
  EXPECT_FALSE(IsDecodeStep(prefill));
  StepInput no_logits = Decode(3);  // A PP stage's rows... not sampled.
  no_logits.logit_rows.pop_back();
  EXPECT_FALSE(IsDecodeStep(no_logits));
  StepInput reordered = Decode(3);
  std::swap(reordered.token_seq[0], reordered.token_seq[1]);
  EXPECT_FALSE(IsDecodeStep(reordered));
}

TEST(PadDecodeStepTest, RealRowsFirstThenPaddingOverBlockZero) {
  const StepInput s = Decode(3);
  const PaddedDecode p = PadDecodeStep(s, 8);
  EXPECT_EQ(p.padding, 5);
  EXPECT_EQ(p.tokens, (std::vector<int32_t>{100, 101, 102, 0, 0, 0, 0, 0}));
  EXPECT_EQ(p.positions, (std::vector<int32_t>{3, 23, 43, 0, 0, 0, 0, 0}));
  EXPECT_EQ(p.token_seq, (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(p.logit_rows, p.token_seq);
  ASSERT_EQ(p.block_tables.size(), 8u);
  for (int i = 0; i < 3; ++i) {
    // Views of the step's own tables, not copies.
    EXPECT_EQ(p.block_tables[i].data(), s.block_tables[i].data());
  }
  for (int i = 3; i < 8; ++i) {
    EXPECT_EQ(std::vector<int32_t>(p.block_tables[i].begin(),
                                   p.block_tables[i].end()),
              std::vector<int32_t>{0});
  }
  EXPECT_EQ(PadDecodeStep(s, 3).padding, 0);
}

// The cache against a model of what it must hold: fake graphs are ints.
TEST(GraphCacheTest, KeepsTheMostRecentlyUsedAndDestroysTheRest) {
  std::vector<intptr_t> destroyed;
  {
    GraphCache cache(3, 2, [&](void* g) {
      destroyed.push_back(reinterpret_cast<intptr_t>(g));
    });
    const auto graph = [](intptr_t i) { return reinterpret_cast<void*>(i); };
    cache.Insert({1}, graph(1));
    cache.Insert({2}, graph(2));
    cache.Insert({3}, graph(3));
    EXPECT_EQ(cache.Find({1}), graph(1));  // {2} is now the oldest.
    EXPECT_EQ(cache.Find({4}), nullptr);
    cache.Insert({4}, graph(4));
    EXPECT_EQ(destroyed, std::vector<intptr_t>{2});
    EXPECT_EQ(cache.Find({2}), nullptr);
    EXPECT_EQ(cache.size(), 3u);
    EXPECT_EQ(cache.evictions(), 1);
    EXPECT_EQ(cache.Find({3}), graph(3));
    EXPECT_EQ(cache.Find({4}), graph(4));
    cache.Insert({5}, graph(5));  // {1} is the oldest now.
    EXPECT_EQ(destroyed, (std::vector<intptr_t>{2, 1}));
    cache.Clear();
    EXPECT_EQ(cache.size(), 0u);
    EXPECT_EQ(destroyed.size(), 5u);
    cache.Insert({6, 7}, graph(6));
  }
  // The destructor destroys what is left, once each.
  EXPECT_EQ(destroyed, (std::vector<intptr_t>{2, 1, 3, 4, 5, 6}));
}

TEST(GraphCacheTest, FailedShapesRunEagerlyUntilTooManyFail) {
  GraphCache cache(4, 2, [](void*) {});
  EXPECT_FALSE(cache.Failed({8, 1}));
  cache.MarkFailed({8, 1});
  EXPECT_TRUE(cache.Failed({8, 1}));
  EXPECT_FALSE(cache.Failed({16, 1}));
  EXPECT_FALSE(cache.Disabled());
  cache.MarkFailed({8, 1});  // The same shape again counts once.
  EXPECT_FALSE(cache.Disabled());
  cache.MarkFailed({16, 1});
  EXPECT_TRUE(cache.Disabled());
  cache.Clear();  // Buffers moved: failures stand.
  EXPECT_TRUE(cache.Failed({8, 1}));
}

}  // namespace
}  // namespace shardlm
