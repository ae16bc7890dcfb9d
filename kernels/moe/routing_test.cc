// Mixture-of-experts routing against hand-computed softmax / top-k, and
// GLM-4.5 / DeepSeek V3's sigmoid routing (bias, groups, scale).
#include "kernels/moe/routing.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"
#include "testing/status.h"

namespace shardlm {
namespace {

// softmax([0, ln 2, ln 3, 0]) = [1, 2, 3, 1] / 7.
const std::vector<float> kLogits = {0.0f, std::log(2.0f), std::log(3.0f), 0.0f};

TEST(RouteTokenTest, TopTwoRenormalized) {
  const auto r = RouteToken(kLogits.data(), 4, 2, /*renormalize=*/true);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].first, 2);
  EXPECT_EQ(r[1].first, 1);
  EXPECT_NEAR(r[0].second, 3.0 / 5, 1e-6);
  EXPECT_NEAR(r[1].second, 2.0 / 5, 1e-6);
}

TEST(RouteTokenTest, TopTwoAsProbabilities) {
  const auto r = RouteToken(kLogits.data(), 4, 2, /*renormalize=*/false);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_NEAR(r[0].second, 3.0 / 7, 1e-6);
  EXPECT_NEAR(r[1].second, 2.0 / 7, 1e-6);
}

TEST(RouteTokenTest, TiesGoToTheLowerExpert) {
  // Experts 0 and 3 tie (1/7 each); the third place is expert 0.
  const auto r = RouteToken(kLogits.data(), 4, 3, /*renormalize=*/false);
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[2].first, 0);
  EXPECT_NEAR(r[2].second, 1.0 / 7, 1e-6);
  // All equal: the first k experts in order.
  const std::vector<float> flat(6, 0.5f);
  const auto f = RouteToken(flat.data(), 6, 4, true);
  ASSERT_EQ(f.size(), 4u);
  for (int k = 0; k < 4; ++k) {
    EXPECT_EQ(f[k].first, k);
    EXPECT_NEAR(f[k].second, 0.25, 1e-6);
  }
}

TEST(RouteTokenTest, TopOneAndTopAll) {
  const auto one = RouteToken(kLogits.data(), 4, 1, true);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].first, 2);
  EXPECT_EQ(one[0].second, 1.0f);  // Renormalized alone.
  const auto one_p = RouteToken(kLogits.data(), 4, 1, false);
  EXPECT_NEAR(one_p[0].second, 3.0 / 7, 1e-6);
  // Every expert: the softmax itself, in decreasing order, ties by index.
  const auto all = RouteToken(kLogits.data(), 4, 4, true);
  const std::vector<int32_t> order = {2, 1, 0, 3};
  const std::vector<double> p = {3.0 / 7, 2.0 / 7, 1.0 / 7, 1.0 / 7};
  for (int k = 0; k < 4; ++k) {
    EXPECT_EQ(all[k].first, order[k]);
    EXPECT_NEAR(all[k].second, p[k], 1e-6);
  }
}

TEST(RouteTokensTest, GroupsTokensByExpertInTokenOrder) {
  // Three tokens, all of which prefer expert 1 then expert 0.
  const std::vector<float> logits = {1, 2, 0,  //
                                     1, 3, 0,  //
                                     0, 5, -1};
  auto r = RouteTokens(logits.data(), 3, 3, 2, true);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->tokens[1], (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(r->tokens[0], (std::vector<int32_t>{0, 1, 2}));
  EXPECT_TRUE(r->tokens[2].empty());
  // Token 2: softmax of [0, 5] over the pair = [1, e^5] / (1 + e^5).
  EXPECT_NEAR(r->weights[1][2], std::exp(5.0) / (1 + std::exp(5.0)), 1e-6);
  EXPECT_NEAR(r->weights[0][2], 1 / (1 + std::exp(5.0)), 1e-6);
}

TEST(RouteTokensTest, RefusesBadTopKAndNonFiniteLogits) {
  const std::vector<float> logits = {0, 1, 2, 3};
  EXPECT_TRUE(testing_util::IsError(RouteTokens(logits.data(), 1, 4, 5, true),
                                    absl::StatusCode::kInvalidArgument,
                                    "top-k 5 of 4"));
  EXPECT_FALSE(RouteTokens(logits.data(), 1, 4, 0, true).ok());
  const std::vector<float> nan = {0, NAN, 2, 3};
  EXPECT_TRUE(testing_util::IsError(RouteTokens(nan.data(), 1, 4, 2, true),
                                    absl::StatusCode::kInvalidArgument,
                                    "expert 1"));
}

double Sigmoid(double x) { return 1 / (1 + std::exp(-x)); }

TEST(RouteTokenSigmoidTest, WeightsAreTheScoresRenormalizedAndScaled) {
  const std::vector<float> logits = {0.5f, -1.0f, 2.0f, 1.0f};
  const RouterSpec spec{.experts = 4,
                        .top_k = 2,
                        .gating = ExpertGating::kSigmoid,
                        .renormalize = true,
                        .scale = 2.5f};
  const auto r = RouteToken(logits.data(), spec);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].first, 2);
  EXPECT_EQ(r[1].first, 3);
  const double s2 = Sigmoid(2.0), s3 = Sigmoid(1.0);
  EXPECT_NEAR(r[0].second, 2.5 * s2 / (s2 + s3), 1e-6);
  EXPECT_NEAR(r[1].second, 2.5 * s3 / (s2 + s3), 1e-6);
  // Not renormalized: the sigmoids themselves, scaled.
  RouterSpec raw = spec;
  raw.renormalize = false;
  const auto p = RouteToken(logits.data(), raw);
  EXPECT_NEAR(p[0].second, 2.5 * s2, 1e-6);
  EXPECT_NEAR(p[1].second, 2.5 * s3, 1e-6);
}

TEST(RouteTokenSigmoidTest, TheBiasChoosesButDoesNotWeigh) {
  const std::vector<float> logits = {0.5f, -1.0f, 2.0f, 1.0f};
  // Expert 1's bias lifts it above every other choice; expert 2's sinks it.
  const std::vector<float> bias = {0.0f, 3.0f, -2.0f, 0.0f};
  const RouterSpec spec{.experts = 4,
                        .top_k = 2,
                        .gating = ExpertGating::kSigmoid,
                        .score_bias = bias,
                        .renormalize = true};
  const auto r = RouteToken(logits.data(), spec);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].first, 1);  // sigmoid(-1) + 3 = 3.27
  EXPECT_EQ(r[1].first, 3);  // sigmoid(1) = 0.73 > sigmoid(0.5) = 0.62
  const double s1 = Sigmoid(-1.0), s3 = Sigmoid(1.0);
  EXPECT_NEAR(r[0].second, s1 / (s1 + s3), 1e-6);
  EXPECT_NEAR(r[1].second, s3 / (s1 + s3), 1e-6);
}

TEST(RouteTokenSigmoidTest, OnlyTheBestGroupsMayBeChosen) {
  // 8 experts in 4 groups of 2. Expert 0 has the best single score, but
  // its group's pair sums lowest of the two it competes with: groups score
  // {0,1}: 0.90 + 0.05, {2,3}: 0.80 + 0.70, {4,5}: 0.60 + 0.60,
  // {6,7}: 0.10 + 0.10. The best 2 groups are {2,3} and {4,5}.
  std::vector<float> logits;
  for (double p : {0.90, 0.05, 0.80, 0.70, 0.60, 0.60, 0.10, 0.10}) {
    logits.push_back(static_cast<float>(std::log(p / (1 - p))));
  }
  RouterSpec spec{.experts = 8,
                  .top_k = 3,
                  .gating = ExpertGating::kSigmoid,
                  .groups = 4,
                  .groups_used = 2,
                  .renormalize = false};
  const auto r = RouteToken(logits.data(), spec);
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[0].first, 2);
  EXPECT_EQ(r[1].first, 3);
  EXPECT_EQ(r[2].first, 4);  // Ties with 5: the lower index.
  EXPECT_NEAR(r[0].second, 0.80, 1e-6);
  EXPECT_NEAR(r[2].second, 0.60, 1e-6);
  // With every group allowed, expert 0 is first.
  spec.groups_used = 4;
  EXPECT_EQ(RouteToken(logits.data(), spec)[0].first, 0);
}

TEST(RouteTokenSigmoidTest, SoftmaxWithScaleAndGroups) {
  // Softmax scores go through the same choice: [1, 2, 3, 1] / 7, groups
  // {0,1} (3/7) and {2,3} (4/7); top 1 of the best group, times 2.
  const RouterSpec spec{.experts = 4,
                        .top_k = 1,
                        .gating = ExpertGating::kSoftmax,
                        .groups = 2,
                        .groups_used = 1,
                        .renormalize = false,
                        .scale = 2.0f};
  const auto r = RouteToken(kLogits.data(), spec);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].first, 2);
  EXPECT_NEAR(r[0].second, 2.0 * 3 / 7, 1e-6);
}

TEST(RouteTokensTest, RefusesInconsistentRouterSpecs) {
  const std::vector<float> logits(8, 0.0f);
  const std::vector<float> short_bias(3, 0.0f);
  const RouterSpec ok{.experts = 8,
                      .top_k = 2,
                      .gating = ExpertGating::kSigmoid,
                      .groups = 4,
                      .groups_used = 1};
  EXPECT_TRUE(RouteTokens(logits.data(), 1, ok).ok());
  RouterSpec bad = ok;
  bad.top_k = 3;  // One group of 2 cannot hold 3.
  EXPECT_TRUE(testing_util::IsError(RouteTokens(logits.data(), 1, bad),
                                    absl::StatusCode::kInvalidArgument,
                                    "cannot hold the top 3"));
  bad = ok;
  bad.groups = 3;  // 8 experts do not split into 3 groups.
  EXPECT_FALSE(RouteTokens(logits.data(), 1, bad).ok());
  bad = ok;
  bad.score_bias = short_bias;
  EXPECT_TRUE(testing_util::IsError(RouteTokens(logits.data(), 1, bad),
                                    absl::StatusCode::kInvalidArgument,
                                    "score bias of 3 values for 8 experts"));
  bad = ok;
  bad.scale = 0;
  EXPECT_FALSE(RouteTokens(logits.data(), 1, bad).ok());
}

}  // namespace
}  // namespace shardlm
