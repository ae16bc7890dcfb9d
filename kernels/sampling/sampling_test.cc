#include "kernels/sampling/sampling.h"

#include <cmath>
#include <map>
#include <vector>

#include "gtest/gtest.h"
#include "testing/status.h"

namespace shardlm {
namespace {

using testing_util::IsError;

TEST(SamplingTest, GreedyPicksLowestIndexOfTheMaximum) {
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 2.0f};
  EXPECT_EQ(SampleToken(logits, {.temperature = 0}, 0), 1);
  // top_k = 1 is greedy whatever the temperature.
  EXPECT_EQ(SampleToken(logits, {.temperature = 5, .top_k = 1}, 3), 1);
}

TEST(SamplingTest, SameSeedAndStepGiveTheSameToken) {
  std::vector<float> logits(1000);
  for (int i = 0; i < 1000; ++i) logits[i] = std::sin(i * 0.37f) * 3;
  const SamplingParams p{.temperature = 1.0f, .seed = 42};
  std::vector<int32_t> a, b, c;
  for (int step = 0; step < 50; ++step) {
    a.push_back(SampleToken(logits, p, step));
    b.push_back(SampleToken(logits, p, step));
    c.push_back(SampleToken(logits, {.temperature = 1.0f, .seed = 43}, step));
  }
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
}

// Frequencies over many steps approach softmax(logits / T).
TEST(SamplingTest, TemperatureSamplingFollowsTheSoftmax) {
  const std::vector<float> logits = {1.0f, 2.0f, 0.0f};
  const float t = 0.7f;
  std::vector<int> counts(3);
  const int draws = 40000;
  for (int step = 0; step < draws; ++step) {
    ++counts[SampleToken(logits, {.temperature = t, .seed = 7}, step)];
  }
  double z = 0;
  for (float l : logits) z += std::exp(l / t);
  for (int i = 0; i < 3; ++i) {
    const double p = std::exp(logits[i] / t) / z;
    // 5 standard deviations of a binomial proportion.
    EXPECT_NEAR(counts[i] / double{draws}, p,
                5 * std::sqrt(p * (1 - p) / draws))
        << i;
  }
}

TEST(SamplingTest, TopKAndTopPRestrictTheSupport) {
  // Probabilities at T=1 are about 0.64, 0.24, 0.09, 0.03.
  const std::vector<float> logits = {3.0f, 2.0f, 1.0f, 0.0f};
  std::map<int32_t, int> top_k, top_p;
  for (int step = 0; step < 5000; ++step) {
    ++top_k[SampleToken(logits, {.temperature = 1, .top_k = 2, .seed = 1},
                        step)];
    ++top_p[SampleToken(logits, {.temperature = 1, .top_p = 0.8f, .seed = 2},
                        step)];
  }
  EXPECT_EQ(top_k.size(), 2u);
  EXPECT_TRUE(top_k.contains(0) && top_k.contains(1));
  // 0.64 < 0.8 <= 0.64 + 0.24: the nucleus is {0, 1}.
  EXPECT_EQ(top_p.size(), 2u);
  EXPECT_TRUE(top_p.contains(0) && top_p.contains(1));
}

// top_k at or above the vocabulary keeps every token: the same draws as
// top_k off. It used to take logits[0] as the softmax's maximum, so a first
// logit far below the others overflowed exp() and broke the distribution.
TEST(SamplingTest, TopKOfTheWholeVocabularyIsTopKOff) {
  const std::vector<float> logits = {-1000.0f, 0.0f, 5.0f, 4.5f};
  for (int32_t k : {4, 5, 1000}) {
    for (int step = 0; step < 200; ++step) {
      const int32_t off =
          SampleToken(logits, {.temperature = 0.5f, .seed = 3}, step);
      const int32_t all = SampleToken(
          logits, {.temperature = 0.5f, .top_k = k, .seed = 3}, step);
      ASSERT_EQ(all, off) << "top_k " << k << " step " << step;
      ASSERT_TRUE(all == 2 || all == 3) << all;
    }
  }
}

// In [0, 1) and uniform: a chi-square test over 20 bins, per seed, and
// draws of neighbouring seeds and steps are not equal (a constant 0.5, or
// a draw ignoring the seed, fails).
TEST(SamplingTest, UniformIsInRangeAndUniform) {
  constexpr int kBins = 20, kDraws = 20000;
  for (uint64_t seed : {0ull, 123ull, ~0ull}) {
    std::vector<int> bins(kBins);
    for (uint64_t s = 0; s < kDraws; ++s) {
      const double u = SampleUniform(seed, s);
      ASSERT_GE(u, 0.0);
      ASSERT_LT(u, 1.0);
      ++bins[static_cast<int>(u * kBins)];
    }
    const double expected = double{kDraws} / kBins;
    double chi2 = 0;
    for (int b : bins) chi2 += (b - expected) * (b - expected) / expected;
    // 19 degrees of freedom: P(chi2 > 43.8) = 0.001.
    EXPECT_LT(chi2, 43.8) << "seed " << seed;
  }
  int equal = 0;
  for (uint64_t s = 0; s < 1000; ++s) {
    equal += SampleUniform(7, s) == SampleUniform(8, s);
    equal += SampleUniform(7, s) == SampleUniform(7, s + 1);
  }
  EXPECT_EQ(equal, 0);
}

TEST(SamplingTest, ValidatesParams) {
  EXPECT_TRUE(
      ValidateSamplingParams({.temperature = 0.8f, .top_k = 40, .top_p = 0.95f})
          .ok());
  const auto kInvalid = absl::StatusCode::kInvalidArgument;
  EXPECT_TRUE(IsError(ValidateSamplingParams({.temperature = -1}), kInvalid,
                      "temperature must be >= 0, got -1"));
  EXPECT_TRUE(IsError(ValidateSamplingParams({.temperature = NAN}), kInvalid,
                      "temperature must be >= 0, got nan"));
  EXPECT_TRUE(IsError(ValidateSamplingParams({.top_k = -2}), kInvalid,
                      "top_k must be >= 0, got -2"));
  EXPECT_TRUE(IsError(ValidateSamplingParams({.top_p = 0}), kInvalid,
                      "top_p must be in (0, 1], got 0"));
  EXPECT_TRUE(IsError(ValidateSamplingParams({.top_p = 1.5f}), kInvalid,
                      "top_p must be in (0, 1], got 1.5"));
}

}  // namespace
}  // namespace shardlm
