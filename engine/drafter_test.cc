// Prompt lookup's proposals and the speculation policy's choices, worked
// out by hand.
#include "engine/drafter.h"

#include <vector>

#include "engine/speculation_policy.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardlm {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

TEST(NgramDrafterTest, ProposesWhatFollowedTheLatestEarlierOccurrence) {
  NgramDrafter d(2, 3);
  // "1 2 3 4 5 9 1 2 3 7 8 1 2 3": the last 3-gram (1 2 3) occurred at
  // 0..2 and 6..8; the latest one was followed by 7 8 1 2 3.
  const std::vector<int32_t> t = {1, 2, 3, 4, 5, 9, 1, 2, 3, 7, 8, 1, 2, 3};
  EXPECT_THAT(d.Draft(t, 4), ElementsAre(7, 8, 1, 2));
  EXPECT_THAT(d.Draft(t, 1), ElementsAre(7));
  // Nothing known follows "3 6": no proposal, and none from 1-grams
  // (min_n 2).
  std::vector<int32_t> u = t;
  u.push_back(6);
  EXPECT_THAT(d.Draft(u, 4), IsEmpty());
  // Calls index what was added since the last one: "3 6" is now known.
  u.insert(u.end(), {11, 12, 3, 6});
  EXPECT_THAT(d.Draft(u, 4), ElementsAre(11, 12, 3, 6));
}

TEST(NgramDrafterTest, ProposesNoMoreThanTheContextHolds) {
  NgramDrafter d(1, 2);
  // The latest earlier "5" is the one before last: only one token follows.
  EXPECT_THAT(d.Draft(std::vector<int32_t>{4, 5, 5}, 8), ElementsAre(5));
  EXPECT_THAT(d.Draft(std::vector<int32_t>{4}, 8), IsEmpty());
  EXPECT_THAT(d.Draft(std::vector<int32_t>{}, 8), IsEmpty());
}

TEST(SpeculationOptionsTest, RefusesOutOfRangeValuesByFlag) {
  SpeculationOptions o{.method = SpeculationOptions::Method::kNgram};
  EXPECT_TRUE(o.Validate().ok());
  o.max_tokens = 17;
  EXPECT_THAT(std::string(o.Validate().message()),
              ::testing::HasSubstr("--num-speculative-tokens"));
  o.max_tokens = 4;
  o.ngram_min = 3;
  o.ngram_max = 2;
  EXPECT_THAT(std::string(o.Validate().message()),
              ::testing::HasSubstr("--ngram-min"));
  EXPECT_FALSE(ParseSpeculationMethod("draft").ok());
  EXPECT_EQ(*ParseSpeculationMethod("ngram"),
            SpeculationOptions::Method::kNgram);
}

TEST(DraftAcceptanceTest, CountsKeptDraftsAndRejections) {
  DraftAcceptance a;
  EXPECT_DOUBLE_EQ(a.rate(), 0.5);
  a.Observe(4, 4);  // All kept: no rejection.
  EXPECT_DOUBLE_EQ(a.accepted, 0.9 + 4);
  EXPECT_DOUBLE_EQ(a.rejected, 0.9);
  a.Observe(4, 1);
  EXPECT_DOUBLE_EQ(a.accepted, 4.9 * 0.9 + 1);
  EXPECT_DOUBLE_EQ(a.rejected, 0.9 * 0.9 + 1);
}

SpeculationPolicy Policy(bool adaptive = true) {
  return SpeculationPolicy({.method = SpeculationOptions::Method::kNgram,
                            .max_tokens = 4,
                            .adaptive = adaptive});
}

TEST(SpeculationPolicyTest, UnmeasuredRowsAreTriedLikeliestFirst) {
  const SpeculationPolicy p = Policy();
  // Nothing measured: every draft is worth a try, within the spare rows,
  // the likeliest first (0.9^1, 0.9^2, then 0.5^1 ...).
  EXPECT_THAT(p.Plan({0.9, 0.5}, {4, 4}, 100), ElementsAre(4, 4));
  EXPECT_THAT(p.Plan({0.9, 0.5}, {4, 4}, 3), ElementsAre(3, 0));
  EXPECT_THAT(p.Plan({0.9, 0.5}, {1, 2}, 100), ElementsAre(1, 2));
}

TEST(SpeculationPolicyTest, DraftsOnlyWhileTokensPerSecondGrow) {
  SpeculationPolicy p = Policy();
  // Rows cost little up to 3, then each costs a whole decode step.
  p.ObserveStep(1, 1.0);
  p.ObserveStep(2, 1.05);
  p.ObserveStep(3, 1.1);
  for (int64_t r = 4; r <= 20; ++r) p.ObserveStep(r, 1.1 + (r - 3));
  // One sequence at 0.9: 1 + 0.9 + 0.81 tokens in 1.1 s; a fourth row
  // (+0.73 in 2.1 s) does not pay.
  EXPECT_THAT(p.Plan({0.9}, {4}, 100), ElementsAre(2));
  // At 0.1 acceptance, the first draft's 0.1 tokens cost 5%: still worth
  // it; the second (0.01 for another 5%) is not.
  EXPECT_THAT(p.Plan({0.1}, {4}, 100), ElementsAre(1));
  // A busy batch of 4 (rows 4 already cost full steps): no drafts.
  EXPECT_THAT(p.Plan({0.9, 0.9, 0.9, 0.9}, {4, 4, 4, 4}, 100),
              ElementsAre(0, 0, 0, 0));
}

TEST(SpeculationPolicyTest, StepTimesBetweenAndPastMeasuredRowsAreLines) {
  SpeculationPolicy p = Policy();
  EXPECT_EQ(p.StepSeconds(3), 0);  // Nothing measured.
  p.ObserveStep(2, 1.0);
  EXPECT_EQ(p.StepSeconds(1), 0.5);  // Below: in proportion.
  EXPECT_EQ(p.StepSeconds(9), 1.0);  // Above, one measured: the same.
  p.ObserveStep(6, 3.0);
  EXPECT_DOUBLE_EQ(p.StepSeconds(4), 2.0);  // Between: the line.
  EXPECT_DOUBLE_EQ(p.StepSeconds(8), 4.0);  // Past: 0.5 s a row more.
  p.ObserveStep(6, 8.0);                    // A moving average: 4 now.
  EXPECT_DOUBLE_EQ(p.StepSeconds(6), 4.0);
}

TEST(SpeculationPolicyTest, NewSequencesStartFromTheServersAcceptance) {
  SpeculationPolicy p = Policy();
  EXPECT_DOUBLE_EQ(p.NewSequence().rate(), 0.5);
  for (int i = 0; i < 50; ++i) p.ObserveVerification(4, 0);
  EXPECT_LT(p.NewSequence().rate(), 0.1);
  for (int i = 0; i < 200; ++i) p.ObserveVerification(4, 4);
  EXPECT_GT(p.NewSequence().rate(), 0.9);
}

TEST(SpeculationPolicyTest, NotAdaptiveDraftsAllItCan) {
  SpeculationPolicy p = Policy(/*adaptive=*/false);
  p.ObserveStep(1, 1.0);
  p.ObserveStep(2, 100.0);
  EXPECT_THAT(p.Plan({0.1, 0.1}, {4, 2}, 100), ElementsAre(4, 2));
  EXPECT_THAT(p.Plan({0.1, 0.1}, {4, 2}, 5), ElementsAre(4, 1));
}

}  // namespace
}  // namespace shardlm
