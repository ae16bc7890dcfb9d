#include "engine/block_manager.h"

#include <algorithm>
#include <map>
#include <random>
#include <set>

#include "absl/strings/str_cat.h"
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
  EXPECT_EQ(bm.device_usage().free, 10);
  EXPECT_EQ(bm.used_blocks(), 0);
  EXPECT_TRUE(bm.Table(1).empty());
}

// Context parallel over 2 ranks: entry j of a table takes an id of rank j
// % 2 whenever one is free, after frees in any order; when that rank's ids
// run out, any free one (still correct: ownership follows the id).
// Hybrid models: a sequence takes a state slot with its table and gives it
// back with its blocks; with every slot held a new sequence is refused,
// with nothing taken, however many blocks are free; prefix caching is off.
TEST(BlockManagerTest, StateSlotsFollowTables) {
  BlockManager bm(10, 16, 0, /*prefix_caching=*/true);
  bm.set_state_slots(2);
  EXPECT_FALSE(bm.prefix_caching());
  ASSERT_TRUE(bm.Reserve(1, 17).ok());
  ASSERT_TRUE(bm.Reserve(2, 1).ok());
  EXPECT_GE(bm.StateSlot(1), 0);
  EXPECT_GE(bm.StateSlot(2), 0);
  EXPECT_NE(bm.StateSlot(1), bm.StateSlot(2));
  ASSERT_TRUE(bm.Reserve(1, 40).ok());  // Growing keeps the slot.
  EXPECT_EQ(bm.FreeStateSlots(), 0);
  const absl::Status full = bm.Reserve(3, 1);
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted) << full;
  EXPECT_TRUE(bm.Table(3).empty());
  EXPECT_EQ(bm.StateSlot(3), -1);
  EXPECT_EQ(bm.used_blocks(), 4);
  const int32_t freed = bm.StateSlot(1);
  bm.Free(1);
  EXPECT_EQ(bm.StateSlot(1), -1);
  EXPECT_EQ(bm.FreeStateSlots(), 1);
  ASSERT_TRUE(bm.Reserve(3, 1).ok());
  EXPECT_EQ(bm.StateSlot(3), freed);
  const std::vector<int32_t> prompt(32, 7);
  EXPECT_EQ(bm.AttachPrefix(4, prompt, 31), 0);
}

// A state swapped out takes a host slot (ids after the device's) and frees
// its device slot at once; swapped in, the reverse; each move is one copy,
// in order. With no free slot on the other side nothing changes.
TEST(BlockManagerTest, StatesSwapBetweenSlotTiers) {
  BlockManager bm(10, 16, 10);
  bm.set_state_slots(2, 1);
  ASSERT_TRUE(bm.Reserve(1, 1).ok());
  ASSERT_TRUE(bm.Reserve(2, 1).ok());
  const int32_t s1 = bm.StateSlot(1), s2 = bm.StateSlot(2);
  ASSERT_TRUE(bm.SwapOutState(1));
  EXPECT_EQ(bm.StateSlot(1), 2);  // The host slot.
  EXPECT_TRUE(bm.IsHostSlot(bm.StateSlot(1)));
  EXPECT_EQ(bm.FreeStateSlots(), 1);
  EXPECT_FALSE(bm.SwapOutState(2)) << "the one host slot is taken";
  EXPECT_EQ(bm.StateSlot(2), s2);
  ASSERT_TRUE(bm.Reserve(3, 1).ok());  // Takes the freed device slot.
  EXPECT_EQ(bm.StateSlot(3), s1);
  EXPECT_FALSE(bm.SwapInState(1)) << "no device slot is free";
  bm.Free(2);
  ASSERT_TRUE(bm.SwapInState(1));
  EXPECT_EQ(bm.StateSlot(1), s2);
  EXPECT_EQ(
      bm.TakeStateCopies(),
      (std::vector<BlockCopy>{{.src = s1, .dst = 2}, {.src = 2, .dst = s2}}));
  EXPECT_TRUE(bm.TakeStateCopies().empty());
  EXPECT_EQ(bm.counters().states_swapped_out, 1);
  EXPECT_EQ(bm.counters().states_swapped_in, 1);
  bm.Free(1);
  bm.Free(3);
  EXPECT_EQ(bm.FreeStateSlots(), 2);
  ASSERT_TRUE(bm.Reserve(4, 1).ok());
  EXPECT_TRUE(bm.SwapOutState(4)) << "the host slot came back";
}

TEST(BlockManagerTest, InterleavesTablesOverCpRanks) {
  BlockManager bm(12, 16);
  bm.set_interleave(2);
  ASSERT_TRUE(bm.Reserve(1, 3 * 16).ok());
  ASSERT_TRUE(bm.Reserve(2, 2 * 16).ok());
  bm.Free(1);  // Ids 0, 1, 2 back, in an order the LIFO list scrambles.
  ASSERT_TRUE(bm.Reserve(3, 5 * 16).ok());
  const std::vector<int32_t>& t = bm.Table(3);
  for (size_t j = 0; j < t.size(); ++j) {
    EXPECT_EQ(t[j] % 2, static_cast<int32_t>(j % 2)) << "entry " << j;
  }
  // 12 - 2 - 5 = 5 free: ids of both ranks; 5 more entries take them all.
  ASSERT_TRUE(bm.Reserve(3, 10 * 16).ok());
  EXPECT_EQ(bm.DeviceAvailable(), 0);
  bm.Free(2);
  bm.Free(3);
  EXPECT_EQ(bm.used_blocks(), 0);
}

TEST(BlockManagerTest, ExhaustionAllocatesNothing) {
  BlockManager bm(3, 4);
  ASSERT_TRUE(bm.Reserve(1, 8).ok());
  const absl::Status s = bm.Reserve(2, 9);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("only 1 of 3"), absl::string_view::npos)
      << s.message();
  EXPECT_EQ(bm.device_usage().free, 1);
  EXPECT_TRUE(bm.Table(2).empty());
  EXPECT_EQ(bm.Reserve(1, 13).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(bm.Table(1).size(), 2u);
}

TEST(BlockManagerTest, SwapsBetweenTiersWithOrderedCopies) {
  BlockManager bm(4, 4, /*host_blocks=*/3);
  ASSERT_TRUE(bm.Reserve(1, 12).ok());  // 3 device blocks.
  const std::vector<int32_t> device = bm.Table(1);
  EXPECT_EQ(bm.SwapOut(1, 2), 2);  // The two oldest.
  const std::vector<int32_t>& t = bm.Table(1);
  ASSERT_EQ(t.size(), 3u);
  EXPECT_TRUE(bm.IsHost(t[0]) && bm.IsHost(t[1]));
  EXPECT_EQ(t[2], device[2]);
  EXPECT_EQ(bm.HostBlocksOf(1), 2);
  EXPECT_EQ(bm.DeviceBlocksOf(1), 1);
  const std::vector<int32_t> host = {t[0], t[1]};
  EXPECT_EQ(bm.TakeCopies(), (std::vector<BlockCopy>{{device[0], host[0]},
                                                     {device[1], host[1]}}));
  // keep_last protects the block being written; the host has 1 left.
  EXPECT_EQ(bm.SwapOut(1, 5, /*keep_last=*/1), 0);
  EXPECT_EQ(bm.SwapIn(1, 5), 2);
  EXPECT_EQ(bm.HostBlocksOf(1), 0);
  // Host blocks read by these copies are not reused before they ran.
  EXPECT_EQ(bm.HostAvailable(), 1);
  EXPECT_EQ(bm.TakeCopies().size(), 2u);
  EXPECT_EQ(bm.HostAvailable(), 3);
  EXPECT_EQ(bm.counters().swapped_out, 2);
  EXPECT_EQ(bm.counters().swapped_in, 2);
  bm.Free(1);
  EXPECT_EQ(bm.used_blocks(), 0);
}

std::vector<int32_t> Tokens(int n, int salt) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back((i * 7 + salt * 13) % 50);
  return t;
}

// Per-rank usage: each rank's share of each tier, summing to the tier.
void ExpectUsageByRankSums(const BlockManager& bm) {
  const int cp = bm.interleave();
  for (const bool host : {false, true}) {
    SCOPED_TRACE(host ? "host" : "device");
    const TierUsage all = host ? bm.host_usage() : bm.device_usage();
    const std::vector<TierUsage> by =
        host ? bm.HostUsageByRank() : bm.DeviceUsageByRank();
    ASSERT_EQ(by.size(), static_cast<size_t>(cp));
    TierUsage sum;
    for (int r = 0; r < cp; ++r) {
      EXPECT_EQ(by[r].total, all.total / cp) << "rank " << r;
      EXPECT_GE(by[r].used, 0) << "rank " << r;
      sum.total += by[r].total;
      sum.used += by[r].used;
      sum.cached += by[r].cached;
      sum.free += by[r].free;
    }
    EXPECT_EQ(sum.total, all.total);
    EXPECT_EQ(sum.used, all.used);
    EXPECT_EQ(sum.cached, all.cached);
    EXPECT_EQ(sum.free, all.free);
  }
}

// Every entry of a table is on the rank it was on before.
void ExpectSameRanks(const std::vector<int32_t>& before,
                     const std::vector<int32_t>& after, int cp) {
  ASSERT_EQ(before.size(), after.size());
  for (size_t j = 0; j < before.size(); ++j) {
    EXPECT_EQ(after[j] % cp, before[j] % cp) << "entry " << j;
  }
}

// CP 2 and 3 with a host tier: swap out, swap in, spill and a host
// prefix hit (promoted, or attached in place) keep every table entry on
// its rank and every copy within one rank; when one rank's host blocks run
// out its device blocks stay (fewer move) while the other ranks' move, and
// CanSwapOut counts per rank; every block comes back.
TEST(BlockManagerTest, TierCopiesStayOnTheirCpRank) {
  for (const int cp : {2, 3}) {
    SCOPED_TRACE(absl::StrCat("cp ", cp));
    // Per rank: 4 device blocks, 2 host blocks.
    BlockManager bm(4 * cp, 4, 2 * cp, /*prefix_caching=*/true);
    bm.set_interleave(cp);
    const TierUsage device0 = bm.device_usage(), host0 = bm.host_usage();
    const auto copies_stay = [&] {
      for (const BlockCopy& c : bm.TakeCopies()) {
        EXPECT_EQ(c.src % cp, c.dst % cp) << c.src << " -> " << c.dst;
      }
    };
    // 3 blocks per rank, entry j on rank j % cp.
    ASSERT_TRUE(bm.Reserve(1, 3 * cp * 4).ok());
    const std::vector<int32_t> t1 = bm.Table(1);
    for (size_t j = 0; j < t1.size(); ++j) {
      ASSERT_EQ(t1[j] % cp, static_cast<int32_t>(j % cp));
    }
    // All asked out: each rank's host holds 2, so the 2 oldest of each
    // rank move and the third of each stays.
    EXPECT_EQ(bm.SwapOut(1, 3 * cp), 2 * cp);
    ExpectSameRanks(t1, bm.Table(1), cp);
    for (size_t j = 0; j < t1.size(); ++j) {
      EXPECT_EQ(bm.IsHost(bm.Table(1)[j]), j < static_cast<size_t>(2 * cp))
          << "entry " << j;
    }
    EXPECT_FALSE(bm.CanSwapOut(1));
    // Host full on every rank: nothing more moves, nothing is copied.
    copies_stay();
    EXPECT_EQ(bm.SwapOut(1, 1), 0);
    EXPECT_FALSE(bm.has_copies());
    ExpectUsageByRankSums(bm);
    // Back in: each host block to a device block of its rank.
    EXPECT_EQ(bm.SwapIn(1, 3 * cp), 2 * cp);
    ExpectSameRanks(t1, bm.Table(1), cp);
    EXPECT_EQ(bm.HostBlocksOf(1), 0);
    copies_stay();
    bm.Free(1);

    // One rank-0 block out leaves rank 0 one host block, the others 2:
    // two blocks on ranks 0 and 1 can swap out, cp + 1 blocks (two on
    // rank 0) cannot, though the host has cp + 1 blocks in all.
    ASSERT_TRUE(bm.Reserve(2, 4).ok());
    ASSERT_EQ(bm.SwapOut(2, 1), 1);
    ASSERT_TRUE(bm.Reserve(3, 2 * 4).ok());
    EXPECT_TRUE(bm.CanSwapOut(3));
    ASSERT_TRUE(bm.Reserve(4, (cp + 1) * 4).ok());
    EXPECT_GE(bm.HostAvailable(), bm.DeviceBlocksOf(4));
    EXPECT_FALSE(bm.CanSwapOut(4));
    bm.Free(2);
    bm.Free(3);
    bm.Free(4);
    copies_stay();
    ExpectUsageByRankSums(bm);

    // Prefix cache: a's 2 full blocks per rank cached, then evicted by a
    // sequence that takes the whole device: they spill, each to a host
    // block of its own rank.
    const std::vector<int32_t> a = Tokens(cp * 2 * 4 + 1, 1);
    const int64_t n = static_cast<int64_t>(a.size());
    ASSERT_TRUE(bm.Reserve(5, n).ok());
    bm.CacheFullBlocks(5, a, n);
    const std::vector<int32_t> t5(bm.Table(5).begin(),
                                  bm.Table(5).begin() + 2 * cp);
    bm.Free(5);
    const int64_t spilled = bm.counters().spilled;
    ASSERT_TRUE(bm.Reserve(6, 4 * cp * 4).ok());
    EXPECT_EQ(bm.counters().spilled - spilled, 2 * cp);
    copies_stay();
    // Device full: a hit attaches the host blocks in place (no copy), each
    // on its block's rank.
    EXPECT_EQ(bm.AttachPrefix(7, a, n - 1), 2 * cp * 4);
    EXPECT_FALSE(bm.has_copies());
    EXPECT_EQ(bm.HostBlocksOf(7), 2 * cp);
    ExpectSameRanks(t5, bm.Table(7), cp);
    bm.Free(7);
    bm.Free(6);
    // Room on one rank's device only (the last rank's): the hit promotes
    // that rank's first block and attaches the rest in place.
    const int spare = cp - 1;
    ASSERT_TRUE(bm.Reserve(8, (4 * cp - 1) * 4).ok());
    ASSERT_EQ(bm.DeviceAvailable(), 1);
    EXPECT_EQ(bm.DeviceUsageByRank()[spare].free, 1);
    EXPECT_EQ(bm.AttachPrefix(9, a, n), 2 * cp * 4);
    const std::vector<BlockCopy> promoted = bm.TakeCopies();
    ASSERT_EQ(promoted.size(), 1u);
    EXPECT_EQ(promoted[0].src % cp, spare);
    EXPECT_EQ(promoted[0].dst % cp, spare);
    ExpectSameRanks(t5, bm.Table(9), cp);
    for (size_t j = 0; j < bm.Table(9).size(); ++j) {
      EXPECT_EQ(bm.IsHost(bm.Table(9)[j]), j != static_cast<size_t>(spare))
          << "entry " << j;
    }
    ExpectUsageByRankSums(bm);
    bm.Free(9);
    bm.Free(8);
    copies_stay();
    // No leak: every block is back (free or cached), per tier.
    EXPECT_EQ(bm.used_blocks(), 0);
    bm.DropCache();
    EXPECT_EQ(bm.device_usage().free, device0.free);
    EXPECT_EQ(bm.host_usage().free, host0.free);
    ExpectUsageByRankSums(bm);
  }
}

TEST(BlockManagerTest, PrefixCacheSharesFullBlocksAndSpillsToHost) {
  BlockManager bm(4, 4, /*host_blocks=*/2, /*prefix_caching=*/true);
  const std::vector<int32_t> a = Tokens(10, 1);  // 2 full blocks + 2.
  ASSERT_EQ(bm.AttachPrefix(1, a, 9), 0);
  ASSERT_TRUE(bm.Reserve(1, 10).ok());
  bm.CacheFullBlocks(1, a, 10);
  // Shares a's two full blocks; at most max_tokens are attached.
  std::vector<int32_t> b = a;
  b.push_back(3);
  EXPECT_EQ(bm.AttachPrefix(2, b, 10), 8);
  EXPECT_EQ(bm.Table(2),
            std::vector<int32_t>(bm.Table(1).begin(), bm.Table(1).begin() + 2));
  EXPECT_EQ(bm.AttachPrefix(3, a, 7), 4);
  bm.Free(3);
  bm.Free(2);
  const std::vector<int32_t> cached(bm.Table(1).begin(),
                                    bm.Table(1).begin() + 2);
  bm.Free(1);
  EXPECT_EQ(bm.used_blocks(), 0);
  EXPECT_EQ(bm.device_usage().cached, 2);
  EXPECT_EQ(bm.counters().prefix_hit_tokens, 8 + 4);
  // A different sequence fills the device: the cached blocks spill to the
  // host (oldest first) instead of being dropped.
  ASSERT_TRUE(bm.Reserve(4, 16).ok());
  EXPECT_EQ(bm.counters().spilled, 2);
  EXPECT_EQ(bm.host_usage().cached, 2);
  // Least recently used first: the third request touched only block 0.
  const std::vector<BlockCopy> spills = bm.TakeCopies();
  ASSERT_EQ(spills.size(), 2u);
  EXPECT_EQ(spills[0].src, cached[1]);
  EXPECT_EQ(spills[1].src, cached[0]);
  bm.Free(4);
  // A hit on the host copies the blocks back to device blocks, in order.
  EXPECT_EQ(bm.AttachPrefix(5, a, 9), 8);
  const std::vector<BlockCopy> back = bm.TakeCopies();
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[0].src, spills[1].dst);
  EXPECT_EQ(back[1].src, spills[0].dst);
  EXPECT_FALSE(bm.IsHost(back[0].dst));
  EXPECT_FALSE(bm.IsHost(back[1].dst));
  EXPECT_EQ(bm.Table(5), (std::vector<int32_t>{back[0].dst, back[1].dst}));
  bm.Free(5);
  EXPECT_EQ(bm.used_blocks(), 0);
  bm.DropCache();
  EXPECT_EQ(bm.device_usage().free, 4);
  EXPECT_EQ(bm.host_usage().free, 2);
}

// With the device full, prefix blocks cached in the host tier are attached
// where they are (no copy): a long prompt seen before is not recomputed
// because only part of it fits on the device.
TEST(BlockManagerTest, HostPrefixHitsAttachInPlaceWhenTheDeviceIsFull) {
  BlockManager bm(2, 4, /*host_blocks=*/4, /*prefix_caching=*/true);
  const std::vector<int32_t> a = Tokens(8, 1);  // 2 full blocks.
  ASSERT_TRUE(bm.Reserve(1, 8).ok());
  bm.CacheFullBlocks(1, a, 8);
  bm.Free(1);
  ASSERT_TRUE(bm.Reserve(2, 8).ok());  // Fills the device: a's blocks spill.
  const std::vector<BlockCopy> spills = bm.TakeCopies();
  ASSERT_EQ(spills.size(), 2u);
  std::vector<int32_t> b = a;
  b.push_back(7);
  EXPECT_EQ(bm.AttachPrefix(3, b, 8), 8);
  EXPECT_TRUE(bm.TakeCopies().empty());
  ASSERT_EQ(bm.Table(3).size(), 2u);
  for (int32_t blk : bm.Table(3)) EXPECT_TRUE(bm.IsHost(blk)) << blk;
  EXPECT_EQ(bm.HostBlocksOf(3), 2);
  // Pinned while attached: the host blocks are not handed out again.
  EXPECT_EQ(bm.host_usage().cached, 0);
  bm.Free(3);
  EXPECT_EQ(bm.host_usage().cached, 2);  // Cached again, still hits.
  bm.Free(2);
  EXPECT_EQ(bm.used_blocks(), 0);
}

// A simulated pool: each block holds a tag of the tokens written into it.
// Random growth, swaps, prefix hits, spills and frees, with the copies run
// in order before each step's writes (as workers do), must leave every
// sequence able to read back exactly what it computed.
//
// Under CP (interleave 2 and 3) every copy also stays on one rank (src and
// dst of the same id % cp), and the per-rank usage always sums to the
// tiers' usage.
TEST(BlockManagerTest, RandomOperationsPreserveEveryCachedToken) {
  for (const int cp : {1, 2, 3}) {
    constexpr int kBs = 4, kDevice = 12;
    const int kHost = cp == 3 ? 9 : 10;
    for (int seed = 0; seed < 30; ++seed) {
      SCOPED_TRACE(absl::StrCat("cp ", cp, " seed ", seed));
      std::mt19937 rng(seed);
      BlockManager bm(kDevice, kBs, kHost, /*prefix_caching=*/true);
      bm.set_interleave(cp);
      std::vector<uint64_t> pool(kDevice + kHost, 0);
      const auto tag = [](const std::vector<int32_t>& t, int64_t end) {
        uint64_t h = 1469598103934665603ull;
        for (int64_t i = 0; i < end; ++i) h = (h ^ t[i]) * 1099511628211ull;
        return h;
      };
      struct Seq {
        std::vector<int32_t> tokens;
        int64_t computed = 0;
      };
      std::map<int64_t, Seq> seqs;
      int64_t next = 0;
      for (int iter = 0; iter < 200; ++iter) {
        // New sequences share prefixes drawn from three families.
        if (seqs.size() < 5 && rng() % 3 == 0) {
          Seq s;
          s.tokens = Tokens(4 + rng() % 20, rng() % 3);
          const int64_t cut = rng() % s.tokens.size();
          for (int64_t i = cut; i < static_cast<int64_t>(s.tokens.size());
               ++i) {
            s.tokens[i] = rng() % 50;
          }
          s.computed = bm.AttachPrefix(next, s.tokens, s.tokens.size() - 1);
          seqs[next++] = s;
        }
        // Each sequence does one thing per step.
        std::vector<std::pair<int64_t, int64_t>> writes;  // (seq, new computed)
        for (auto it = seqs.begin(); it != seqs.end();) {
          Seq& s = it->second;
          const int64_t id = it->first;
          const int op = rng() % 6;
          if (op == 0 || s.computed == static_cast<int64_t>(s.tokens.size())) {
            bm.Free(id);
            it = seqs.erase(it);
            continue;
          }
          if (op == 1) {
            bm.SwapOut(id, rng() % 4);
          } else if (op == 2) {
            bm.SwapIn(id, rng() % 4);
          } else {
            const int64_t full = s.computed / kBs;
            const int64_t table = bm.Table(id).size();
            bm.SwapOut(id, rng() % 2, static_cast<int32_t>(table - full));
            const int64_t target =
                std::min<int64_t>(s.tokens.size(), s.computed + 1 + rng() % 6);
            if (bm.Reserve(id, target).ok()) writes.push_back({id, target});
          }
          ++it;
        }
        for (const BlockCopy& c : bm.TakeCopies()) {
          ASSERT_EQ(c.src % cp, c.dst % cp)
              << "copy " << c.src << " -> " << c.dst << " crosses CP ranks";
          pool[c.dst] = pool[c.src];
        }
        ExpectUsageByRankSums(bm);
        for (auto [id, target] : writes) {
          Seq& s = seqs[id];
          const std::vector<int32_t>& table = bm.Table(id);
          for (int64_t j = s.computed / kBs; j * kBs < target; ++j) {
            pool[table[j]] =
                tag(s.tokens, std::min<int64_t>(target, (j + 1) * kBs));
          }
          s.computed = target;
          bm.CacheFullBlocks(id, s.tokens, s.computed);
        }
        for (const auto& [id, s] : seqs) {
          const std::vector<int32_t>& table = bm.Table(id);
          ASSERT_GE(static_cast<int64_t>(table.size()) * kBs, s.computed);
          for (int64_t j = 0; j * kBs < s.computed; ++j) {
            ASSERT_EQ(
                pool[table[j]],
                tag(s.tokens, std::min<int64_t>(s.computed, (j + 1) * kBs)))
                << "seed " << seed << " step " << iter << " seq " << id
                << " block " << j;
          }
        }
        // Blocks held by sequences are exactly the distinct table entries.
        std::set<int32_t> held;
        for (const auto& [id, s] : seqs) {
          held.insert(bm.Table(id).begin(), bm.Table(id).end());
        }
        ASSERT_EQ(bm.used_blocks(), static_cast<int32_t>(held.size()));
      }
      for (const auto& [id, s] : seqs) bm.Free(id);
      EXPECT_EQ(bm.used_blocks(), 0);
      EXPECT_GT(bm.counters().prefix_hit_tokens, 0) << "seed " << seed;
    }
  }
}

}  // namespace
}  // namespace shardlm
