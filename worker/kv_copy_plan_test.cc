// PlanKvCopies against the copies' sequential meaning: the plan's runs,
// each applied as an unordered batch (what a backend may do with one run),
// must leave every pool as applying the copies one by one does.
#include "worker/kv_copy_plan.h"

#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace shardlm {
namespace {

using Blocks = std::vector<int>;  // Block id -> its content, both tiers.

Blocks Sequential(Blocks b, const std::vector<BlockCopy>& copies) {
  for (const BlockCopy& c : copies) b[c.dst] = b[c.src];
  return b;
}

// Each run as a batch: every source read before any destination is
// written, and the writes in reverse order (any order must do).
Blocks ByRuns(Blocks b, const std::vector<KvCopyRun>& runs, int device) {
  for (const KvCopyRun& r : runs) {
    const auto id = [&](KvTier t, int32_t i) {
      return t == KvTier::kDevice ? i : device + i;
    };
    std::vector<int> read;
    for (int32_t s : r.src_blocks) read.push_back(b[id(r.src, s)]);
    for (size_t i = r.dst_blocks.size(); i-- > 0;) {
      b[id(r.dst, r.dst_blocks[i])] = read[i];
    }
  }
  return b;
}

TEST(PlanKvCopiesTest, RunsSplitByPoolsAndIndicesArePoolLocal) {
  // Swap out 2 and 3 (device -> host 8, 9), swap in host 10 -> device 4,
  // then a spill of device 5 -> host 11, with 8 device blocks.
  auto plan = PlanKvCopies({{2, 8}, {3, 9}, {10, 4}, {5, 11}}, 8, 4);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const std::vector<KvCopyRun> want = {
      {KvTier::kDevice, KvTier::kHost, {2, 3}, {0, 1}},
      {KvTier::kHost, KvTier::kDevice, {2}, {4}},
      {KvTier::kDevice, KvTier::kHost, {5}, {3}},
  };
  EXPECT_EQ(*plan, want);
}

TEST(PlanKvCopiesTest, ChainsWithinOnePoolKeepTheirOrder) {
  // 5 -> 6 then 6 -> 7 must give 7 the old 5 only through 6's new value:
  // two runs, not one (a merged transfer of 5,6 -> 6,7 would differ).
  auto plan = PlanKvCopies({{5, 6}, {6, 7}}, 8, 0);
  ASSERT_TRUE(plan.ok());
  ASSERT_EQ(plan->size(), 2u);
  // A block overwritten after it was read: also ordered.
  plan = PlanKvCopies({{1, 2}, {3, 1}}, 8, 0);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->size(), 2u);
  // The same destination twice: the last write wins.
  plan = PlanKvCopies({{1, 2}, {3, 2}}, 8, 0);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->size(), 2u);
}

TEST(PlanKvCopiesTest, RandomCopyListsGiveTheSequentialResult) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 2000; ++trial) {
    const int device = 1 + rng() % 6, host = rng() % 6;
    const int total = device + host;
    if (total < 2) continue;
    std::vector<BlockCopy> copies(rng() % 12);
    for (BlockCopy& c : copies) {
      c.src = static_cast<int32_t>(rng() % total);
      do {
        c.dst = static_cast<int32_t>(rng() % total);
      } while (c.dst == c.src);
    }
    Blocks start(total);
    for (int i = 0; i < total; ++i) start[i] = 100 + i;
    auto plan = PlanKvCopies(copies, device, host);
    ASSERT_TRUE(plan.ok()) << plan.status();
    size_t planned = 0;
    for (const KvCopyRun& r : *plan) planned += r.src_blocks.size();
    EXPECT_EQ(planned, copies.size());
    EXPECT_EQ(ByRuns(start, *plan, device), Sequential(start, copies))
        << "trial " << trial;
  }
}

TEST(PlanKvCopiesTest, BadCopiesAreRefused) {
  for (const BlockCopy& bad :
       {BlockCopy{-1, 2}, BlockCopy{2, 12}, BlockCopy{3, 3}}) {
    auto plan = PlanKvCopies({{0, 1}, bad}, 8, 4);
    EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  }
}

}  // namespace
}  // namespace shardlm
