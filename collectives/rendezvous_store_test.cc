// AgreeOnGroupId: how the ranks of an NCCL group (or any group whose id is
// made by one member) learn the id through the coordinator's store. The
// in-memory store stands in for the control plane's (control_store_test
// runs the real one).
#include "collectives/rendezvous_store.h"

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace shardlm {
namespace {

TEST(AgreeOnGroupIdTest, EveryRankGetsRankZerosId) {
  InMemoryStore store;
  constexpr int kRanks = 4;
  std::atomic<int> made{0};
  std::vector<absl::StatusOr<std::string>> got(kRanks, std::string());
  std::vector<std::thread> threads;
  // Rank 0 starts last: the others wait for it.
  for (int r = kRanks - 1; r >= 0; --r) {
    threads.emplace_back([&, r] {
      got[r] = AgreeOnGroupId(
          store, "run1/nccl/tp/0", "tp group of stage 0", r,
          [&]() -> absl::StatusOr<std::string> {
            ++made;
            return std::string("id-\0-of-rank-0", 14);  // Binary, with a NUL.
          },
          absl::Seconds(10));
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(made.load(), 1);  // Only rank 0 makes one.
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_TRUE(got[r].ok()) << "rank " << r << ": " << got[r].status();
    EXPECT_EQ(*got[r], std::string("id-\0-of-rank-0", 14)) << "rank " << r;
  }
}

TEST(AgreeOnGroupIdTest, GroupsWithOtherKeysDoNotMix) {
  InMemoryStore store;
  const auto id_of = [](std::string v) {
    return [v]() -> absl::StatusOr<std::string> { return v; };
  };
  ASSERT_TRUE(
      AgreeOnGroupId(store, "p/tp/0", "tp 0", 0, id_of("A"), absl::Seconds(1))
          .ok());
  ASSERT_TRUE(
      AgreeOnGroupId(store, "p/tp/1", "tp 1", 0, id_of("B"), absl::Seconds(1))
          .ok());
  EXPECT_EQ(
      *AgreeOnGroupId(store, "p/tp/1", "tp 1", 1, id_of("x"), absl::Seconds(1)),
      "B");
  EXPECT_EQ(
      *AgreeOnGroupId(store, "p/tp/0", "tp 0", 2, id_of("x"), absl::Seconds(1)),
      "A");
}

TEST(AgreeOnGroupIdTest, MissingRootIsDeadlineExceededNamingGroupAndKey) {
  InMemoryStore store;
  const auto s = AgreeOnGroupId(
      store, "run1/nccl/pp/1", "pp chain of tp 1", 2,
      []() -> absl::StatusOr<std::string> { return std::string("unused"); },
      absl::Milliseconds(50));
  ASSERT_EQ(s.status().code(), absl::StatusCode::kDeadlineExceeded)
      << s.status();
  const std::string m(s.status().message());
  EXPECT_NE(m.find("pp chain of tp 1"), std::string::npos) << m;
  EXPECT_NE(m.find("rank 2"), std::string::npos) << m;
  EXPECT_NE(m.find("run1/nccl/pp/1"), std::string::npos) << m;
}

TEST(AgreeOnGroupIdTest, RootThatCannotMakeAnIdSaysSoAndPublishesNothing) {
  InMemoryStore store;
  const auto s = AgreeOnGroupId(
      store, "k", "tp group of stage 0", 0,
      []() -> absl::StatusOr<std::string> {
        return absl::UnavailableError("ncclGetUniqueId: no network");
      },
      absl::Seconds(1));
  ASSERT_EQ(s.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(std::string(s.status().message()).find("no network"),
            std::string::npos);
  EXPECT_EQ(store.Get("k", absl::Milliseconds(10)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
}

}  // namespace
}  // namespace shardlm
