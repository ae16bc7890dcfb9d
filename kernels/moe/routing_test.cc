// Mixture-of-experts routing against hand-computed softmax / top-k.
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

}  // namespace
}  // namespace shardlm
