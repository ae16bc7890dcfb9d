#include "coordinator/block_manager.h"

#include <set>

#include "gtest/gtest.h"

namespace shardlm {
namespace {

TEST(BlockManagerTest, GrowsTablesAndReturnsEveryBlock) {
  BlockManager bm(10, 16);
  ASSERT_TRUE(bm.Reserve(1, 17).ok());  // 2 blocks.
  ASSERT_TRUE(bm.Reserve(2, 16).ok());  // 1 block.
  ASSERT_TRUE(bm.Reserve(1, 32).ok());  // Still 2.
  EXPECT_EQ(bm.Table(1).size(), 2u);
  ASSERT_TRUE(bm.Reserve(1, 33).ok());  // 3.
  EXPECT_EQ(bm.used_blocks(), 4);
  std::set<int32_t> ids(bm.Table(1).begin(), bm.Table(1).end());
  ids.insert(bm.Table(2).begin(), bm.Table(2).end());
  EXPECT_EQ(ids.size(), 4u) << "a block was handed out twice";
  bm.Free(1);
  bm.Free(2);
  bm.Free(3);  // Unknown: ignored.
  EXPECT_EQ(bm.free_blocks(), 10);
  EXPECT_TRUE(bm.Table(1).empty());
}

TEST(BlockManagerTest, ExhaustionAllocatesNothing) {
  BlockManager bm(3, 4);
  ASSERT_TRUE(bm.Reserve(1, 8).ok());
  const absl::Status s = bm.Reserve(2, 9);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("only 1 of 3"), absl::string_view::npos);
  EXPECT_EQ(bm.free_blocks(), 1);
  EXPECT_TRUE(bm.Table(2).empty());
  EXPECT_EQ(bm.Reserve(1, 13).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(bm.Table(1).size(), 2u);
}

}  // namespace
}  // namespace shardlm
