#include "router/routing_policy.h"

#include <vector>

#include "engine/block_manager.h"
#include "engine/prefix_events.h"
#include "engine/prefix_hash.h"
#include "gtest/gtest.h"

namespace shardlm {
namespace {

constexpr int32_t kBlock = 4;

std::vector<int32_t> Tokens(int n, int32_t first) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = first + i;
  return t;
}

// An index holding the first `blocks` full blocks of `tokens`.
PrefixIndex IndexOf(const std::vector<int32_t>& tokens, int blocks) {
  PrefixIndex index;
  std::vector<uint64_t> keys = PrefixBlockKeys(tokens, kBlock);
  keys.resize(blocks);
  index.Reset(keys);
  return index;
}

TEST(RoutingPolicyTest, ParsesNamesAndRefusesOthers) {
  EXPECT_EQ(*ParseRoutingPolicy("kv"), RoutingPolicyKind::kKv);
  EXPECT_EQ(*ParseRoutingPolicy("least-load"), RoutingPolicyKind::kLeastLoad);
  EXPECT_EQ(*ParseRoutingPolicy("round-robin"), RoutingPolicyKind::kRoundRobin);
  const auto bad = ParseRoutingPolicy("random");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("'random'"), absl::string_view::npos);
  EXPECT_NE(bad.status().message().find("round-robin"),
            absl::string_view::npos);
}

TEST(RoutingPolicyTest, LongestCachedPrefixWins) {
  const std::vector<int32_t> prompt = Tokens(4 * kBlock + 2, 100);  // 4 full.
  const std::vector<uint64_t> keys = PrefixBlockKeys(prompt, kBlock);
  ASSERT_EQ(keys.size(), 4u);
  const PrefixIndex one = IndexOf(prompt, 1), three = IndexOf(prompt, 3),
                    two = IndexOf(prompt, 2);
  // Replica 1 holds 3 blocks, the most, though it is busier (within the
  // bound: least 0, bound 1.5 * 0 + 4).
  std::vector<ReplicaView> r = {
      {.ready = true, .running = 0, .index = &one},
      {.ready = true, .running = 3, .waiting = 1, .index = &three},
      {.ready = true, .running = 1, .index = &two},
  };
  RoutingPolicy policy({.kind = RoutingPolicyKind::kKv});
  for (int i = 0; i < 3; ++i) {  // Whatever the rotation.
    const RouteDecision d = policy.Choose(r, keys);
    EXPECT_EQ(d.replica, 1);
    EXPECT_EQ(d.cached_blocks, 3);
  }
}

TEST(RoutingPolicyTest, OnlyLeadingBlocksCount) {
  const std::vector<int32_t> prompt = Tokens(3 * kBlock, 7);
  const std::vector<uint64_t> keys = PrefixBlockKeys(prompt, kBlock);
  PrefixIndex gap;  // Blocks 1 and 2 but not block 0: no hit at all.
  gap.Insert(keys[1]);
  gap.Insert(keys[2]);
  EXPECT_EQ(gap.LeadingHits(keys), 0);
  const PrefixIndex first = IndexOf(prompt, 1);
  std::vector<ReplicaView> r = {{.ready = true, .index = &gap},
                                {.ready = true, .running = 2, .index = &first}};
  RoutingPolicy policy({.kind = RoutingPolicyKind::kKv});
  EXPECT_EQ(policy.Choose(r, keys).replica, 1);
  // Another prompt's blocks at the same positions never match: a key names
  // the whole prefix.
  const std::vector<int32_t> other = Tokens(3 * kBlock, 8);
  EXPECT_EQ(first.LeadingHits(PrefixBlockKeys(other, kBlock)), 0);
}

TEST(RoutingPolicyTest, LoadBoundOverridesCachedPrefix) {
  const std::vector<int32_t> prompt = Tokens(2 * kBlock, 1);
  const std::vector<uint64_t> keys = PrefixBlockKeys(prompt, kBlock);
  const PrefixIndex hot = IndexOf(prompt, 2);
  // least = 2; bound = 1.5 * 2 + 4 = 7. Replica 0 (load 8) is over it.
  std::vector<ReplicaView> r = {
      {.ready = true, .running = 6, .waiting = 2, .index = &hot},
      {.ready = true, .running = 2},
      {.ready = true, .running = 3},
  };
  RoutingPolicy policy({.kind = RoutingPolicyKind::kKv});
  RouteDecision d = policy.Choose(r, keys);
  EXPECT_EQ(d.replica, 1);  // No hits anywhere eligible: fewest running.
  EXPECT_EQ(d.cached_blocks, 0);
  // At load 7 (= the bound) it is eligible again and its prefix wins.
  r[0].waiting = 1;
  d = policy.Choose(r, keys);
  EXPECT_EQ(d.replica, 0);
  EXPECT_EQ(d.cached_blocks, 2);
}

TEST(RoutingPolicyTest, EqualHitsGoToFewestRunning) {
  const std::vector<int32_t> prompt = Tokens(2 * kBlock, 1);
  const std::vector<uint64_t> keys = PrefixBlockKeys(prompt, kBlock);
  const PrefixIndex a = IndexOf(prompt, 2), b = IndexOf(prompt, 2);
  std::vector<ReplicaView> r = {
      {.ready = true, .running = 3, .waiting = 0, .index = &a},
      {.ready = true, .running = 1, .waiting = 2, .index = &b},  // Same load.
      {.ready = true, .running = 0, .index = nullptr},  // Idle, no hits.
  };
  RoutingPolicy policy({.kind = RoutingPolicyKind::kKv});
  for (int i = 0; i < 3; ++i) EXPECT_EQ(policy.Choose(r, keys).replica, 1);
  // Least-load ignores the cache: the idle replica.
  RoutingPolicy least({.kind = RoutingPolicyKind::kLeastLoad});
  for (int i = 0; i < 3; ++i) EXPECT_EQ(least.Choose(r, keys).replica, 2);
}

TEST(RoutingPolicyTest, RemainingTiesRotate) {
  std::vector<ReplicaView> r(3, ReplicaView{.ready = true});
  RoutingPolicy policy({.kind = RoutingPolicyKind::kKv});
  std::vector<int> chosen;
  for (int i = 0; i < 6; ++i) chosen.push_back(policy.Choose(r, {}).replica);
  EXPECT_EQ(chosen, (std::vector<int>{0, 1, 2, 0, 1, 2}));
}

TEST(RoutingPolicyTest, UnreadyAndExcludedReplicasAreNeverChosen) {
  std::vector<ReplicaView> r = {{.ready = false},
                                {.ready = true, .running = 9},
                                {.ready = true, .running = 0}};
  for (RoutingPolicyKind kind :
       {RoutingPolicyKind::kKv, RoutingPolicyKind::kLeastLoad,
        RoutingPolicyKind::kRoundRobin}) {
    RoutingPolicy policy({.kind = kind});
    for (int i = 0; i < 4; ++i) {
      const int got = policy.Choose(r, {}, /*exclude=*/2).replica;
      EXPECT_EQ(got, 1) << RoutingPolicyName(kind);
    }
    r[1].ready = false;
    EXPECT_EQ(policy.Choose(r, {}, 2).replica, -1) << RoutingPolicyName(kind);
    r[1].ready = true;
  }
  RoutingPolicy policy({.kind = RoutingPolicyKind::kKv});
  EXPECT_EQ(policy.Choose({}, {}).replica, -1);
}

TEST(RoutingPolicyTest, RoundRobinCyclesOverReadyReplicas) {
  std::vector<ReplicaView> r = {
      {.ready = true}, {.ready = false}, {.ready = true}};
  RoutingPolicy policy({.kind = RoutingPolicyKind::kRoundRobin});
  std::vector<int> chosen;
  for (int i = 0; i < 6; ++i) chosen.push_back(policy.Choose(r, {}).replica);
  // Turns 0..5 start at 0,1,2,0,1,2; turn 1 skips the unready replica 1.
  EXPECT_EQ(chosen, (std::vector<int>{0, 2, 2, 0, 2, 2}));
}

// The index fed from a real block manager's event log: what the block
// manager would hit, the index predicts; an evicted block stops counting.
TEST(RoutingPolicyTest, IndexFollowsTheBlockManagerIncludingEvictions) {
  PrefixEventLog log;
  BlockManager bm(/*device_blocks=*/3, kBlock, /*host_blocks=*/0,
                  /*prefix_caching=*/true);
  bm.set_event_log(&log);
  PrefixIndex index;
  std::optional<uint64_t> cursor;
  const auto sync = [&] {
    PrefixEventBatch b = log.Since(cursor);
    if (b.reset) index.Reset(b.inserted);
    for (auto [key, inserted] : b.changes) {
      if (inserted) {
        index.Insert(key);
      } else {
        index.Evict(key);
      }
    }
    cursor = b.cursor;
  };
  const std::vector<int32_t> a = Tokens(2 * kBlock, 10);
  ASSERT_TRUE(bm.Reserve(1, 2 * kBlock).ok());
  bm.CacheFullBlocks(1, a, 2 * kBlock);
  bm.Free(1);
  sync();
  const std::vector<uint64_t> keys = PrefixBlockKeys(a, kBlock);
  EXPECT_EQ(index.LeadingHits(keys), 2);
  // The block manager agrees.
  EXPECT_EQ(bm.AttachPrefix(2, a, 2 * kBlock), 2 * kBlock);
  bm.Free(2);
  // Another sequence takes all 3 blocks: both cached ones are evicted
  // (the oldest, block 0, first).
  ASSERT_TRUE(bm.Reserve(3, 3 * kBlock).ok());
  sync();
  EXPECT_EQ(index.size(), 0u);
  EXPECT_EQ(index.LeadingHits(keys), 0);
  bm.Free(3);
  EXPECT_EQ(bm.AttachPrefix(4, a, 2 * kBlock), 0);
}

}  // namespace
}  // namespace shardlm
