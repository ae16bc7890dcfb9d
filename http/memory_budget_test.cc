#include "http/memory_budget.h"

#include <thread>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace shardlm {
namespace {

TEST(MemoryBudgetTest, SharesAreGivenBackWhenTheyEnd) {
  MemoryBudget budget(1000);
  {
    absl::StatusOr<MemoryShare> a = budget.Take(600, "a");
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_EQ(budget.in_use(), 600);
    absl::StatusOr<MemoryShare> b = budget.Take(400, "b");
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_EQ(budget.in_use(), 1000);
    MemoryShare moved = *std::move(b);
    EXPECT_EQ(moved.bytes(), 400);
    EXPECT_EQ(budget.in_use(), 1000);
  }
  EXPECT_EQ(budget.in_use(), 0);
  EXPECT_EQ(budget.peak(), 1000);
  EXPECT_EQ(budget.refused(), 0);
}

TEST(MemoryBudgetTest, RefusesWhatDoesNotFitNamingTheFlag) {
  MemoryBudget budget(1000, "--request-memory-mb");
  absl::StatusOr<MemoryShare> a = budget.Take(800, "a");
  ASSERT_TRUE(a.ok());
  const absl::Time start = absl::Now();
  absl::StatusOr<MemoryShare> b =
      budget.Take(300, "the HTTP body", absl::Milliseconds(50));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(45));
  ASSERT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(b.status().message().find("the HTTP body needs 300 bytes"),
            std::string::npos)
      << b.status();
  EXPECT_NE(b.status().message().find("--request-memory-mb"),
            std::string::npos);
  EXPECT_EQ(budget.refused(), 1);
  EXPECT_EQ(budget.in_use(), 800);
}

TEST(MemoryBudgetTest, MoreThanTheWholeLimitIsRefusedAtOnce) {
  MemoryBudget budget(1000);
  const absl::Time start = absl::Now();
  absl::StatusOr<MemoryShare> a = budget.Take(1001, "a", absl::Seconds(10));
  EXPECT_EQ(a.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST(MemoryBudgetTest, AWaitingShareFitsOnceAnotherEnds) {
  MemoryBudget budget(1000);
  auto a = std::make_unique<MemoryShare>(*budget.Take(900, "a"));
  std::thread releaser([&] {
    absl::SleepFor(absl::Milliseconds(20));
    a.reset();
  });
  absl::StatusOr<MemoryShare> b = budget.Take(500, "b", absl::Seconds(10));
  releaser.join();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(budget.in_use(), 500);
}

TEST(MemoryBudgetTest, ShrinkGivesBackTheRest) {
  MemoryBudget budget(1000);
  absl::StatusOr<MemoryShare> a = budget.Take(700, "a");
  ASSERT_TRUE(a.ok());
  a->ShrinkTo(200);
  EXPECT_EQ(budget.in_use(), 200);
  a->ShrinkTo(500);  // Never grows.
  EXPECT_EQ(budget.in_use(), 200);
  a->Release();
  EXPECT_EQ(budget.in_use(), 0);
  EXPECT_TRUE(budget.Take(0, "nothing").ok());
}

TEST(MemoryBudgetTest, TheDefaultIsAnEighthOfMemoryClamped) {
  const int64_t limit = MemoryBudget::DefaultLimitBytes();
  EXPECT_GE(limit, MemoryBudget::kMinDefaultBytes);
  EXPECT_LE(limit, MemoryBudget::kMaxDefaultBytes);
  const int64_t available = MemoryBudget::AvailableMemoryBytes();
  ASSERT_GT(available, 0);
  if (available / 8 >= MemoryBudget::kMinDefaultBytes &&
      available / 8 <= MemoryBudget::kMaxDefaultBytes) {
    EXPECT_EQ(limit, available / 8);
  }
}

}  // namespace
}  // namespace shardlm
