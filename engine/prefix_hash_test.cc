#include "engine/prefix_hash.h"

#include <algorithm>
#include <optional>
#include <vector>

#include "engine/block_manager.h"
#include "engine/prefix_events.h"
#include "gtest/gtest.h"

namespace shardlm {
namespace {

TEST(PrefixHashTest, KeysChainThroughParents) {
  const std::vector<int32_t> t = {1, 2, 3, 4, 5, 6, 7};
  const std::vector<uint64_t> keys = PrefixBlockKeys(t, 3);
  ASSERT_EQ(keys.size(), 2u);  // The partial block has no key.
  EXPECT_EQ(keys[0], PrefixBlockKey(kPrefixRootKey, {1, 2, 3}));
  EXPECT_EQ(keys[1], PrefixBlockKey(keys[0], {4, 5, 6}));
  // Same tokens under another parent: another key.
  EXPECT_NE(PrefixBlockKey(kPrefixRootKey, {4, 5, 6}), keys[1]);
  EXPECT_TRUE(PrefixBlockKeys({1, 2}, 3).empty());
}

// The keys the block manager publishes are the ones PrefixBlockKeys gives.
TEST(PrefixHashTest, BlockManagerPublishesTheSameKeys) {
  PrefixEventLog log;
  BlockManager bm(8, 4, 0, /*prefix_caching=*/true);
  bm.set_event_log(&log);
  std::vector<int32_t> t(11);
  for (int i = 0; i < 11; ++i) t[i] = 50 + i * 3;
  ASSERT_TRUE(bm.Reserve(1, 11).ok());
  bm.CacheFullBlocks(1, t, 11);
  PrefixEventBatch b = log.Since(std::nullopt);
  EXPECT_TRUE(b.reset);
  std::vector<uint64_t> want = PrefixBlockKeys(t, 4);
  std::sort(want.begin(), want.end());
  EXPECT_EQ(b.inserted, want);
  EXPECT_EQ(b.cursor, 2u);
  // Caching the same blocks again publishes nothing.
  bm.CacheFullBlocks(1, t, 11);
  EXPECT_EQ(log.head(), 2u);
  bm.Free(1);
}

TEST(PrefixEventLogTest, ReadersGetChangesInOrder) {
  PrefixEventLog log(8);
  const PrefixEventBatch first = log.Since(std::nullopt);
  EXPECT_TRUE(first.reset);
  EXPECT_TRUE(first.inserted.empty());
  log.Inserted(5);
  log.Inserted(6);
  log.Inserted(5);  // Already live: no change.
  log.Evicted(5);
  log.Evicted(9);  // Never live: no change.
  log.Inserted(5);
  const PrefixEventBatch b = log.Since(first.cursor);
  EXPECT_FALSE(b.reset);
  using C = std::pair<uint64_t, bool>;
  EXPECT_EQ(b.changes,
            (std::vector<C>{{5, true}, {6, true}, {5, false}, {5, true}}));
  EXPECT_EQ(b.cursor, 4u);
  EXPECT_TRUE(log.Since(b.cursor).changes.empty());
  EXPECT_EQ(log.live_keys(), 2u);
}

TEST(PrefixEventLogTest, AReaderTooFarBehindGetsTheLiveSet) {
  PrefixEventLog log(4);  // Keeps 4 changes.
  const uint64_t start = log.Since(std::nullopt).cursor;
  for (uint64_t k = 1; k <= 6; ++k) log.Inserted(k);
  log.Evicted(2);
  PrefixEventBatch b = log.Since(start);
  EXPECT_TRUE(b.reset);
  EXPECT_EQ(b.inserted, (std::vector<uint64_t>{1, 3, 4, 5, 6}));
  EXPECT_EQ(b.cursor, 7u);
  // A cursor from the future (another log's) is a reset too, never a crash.
  EXPECT_TRUE(log.Since(1000).reset);
}

TEST(PrefixEventLogTest, ClearingResetsEveryReader) {
  PrefixEventLog log;
  log.Inserted(1);
  const uint64_t cursor = log.head();
  log.Cleared();
  PrefixEventBatch b = log.Since(cursor);
  EXPECT_TRUE(b.reset);
  EXPECT_TRUE(b.inserted.empty());
  log.Inserted(2);
  b = log.Since(b.cursor);
  EXPECT_FALSE(b.reset);
  ASSERT_EQ(b.changes.size(), 1u);
  EXPECT_EQ(b.changes[0].first, 2u);
}

// DropCache (a failed step) clears the published set too.
TEST(PrefixEventLogTest, DropCacheIsPublished) {
  PrefixEventLog log;
  BlockManager bm(4, 2, 0, true);
  bm.set_event_log(&log);
  ASSERT_TRUE(bm.Reserve(1, 4).ok());
  bm.CacheFullBlocks(1, std::vector<int32_t>{1, 2, 3, 4}, 4);
  EXPECT_EQ(log.live_keys(), 2u);
  bm.Free(1);
  bm.DropCache();
  EXPECT_EQ(log.live_keys(), 0u);
}

}  // namespace
}  // namespace shardlm
