#include "kernels/sampling/sampling.h"

#include <algorithm>
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

// The logit processors, written the obvious way from their definitions
// (vLLM's order): counts by scanning the output, "in the prompt" by
// scanning the prompt, every token of the vocabulary visited.
std::vector<float> ReferenceProcess(std::vector<float> logits,
                                    const SamplingParams& p,
                                    const std::vector<int32_t>& prompt,
                                    const std::vector<int32_t>& output,
                                    const std::vector<int32_t>& stop_tokens,
                                    int32_t min_tokens) {
  const int32_t vocab = static_cast<int32_t>(logits.size());
  for (const LogitBias& b : p.logit_bias) logits[b.token] += b.bias;
  if (static_cast<int32_t>(output.size()) < min_tokens) {
    for (int32_t t : stop_tokens) logits[t] = -INFINITY;
  }
  for (int32_t t = 0; t < vocab; ++t) {
    int32_t count = 0;
    for (int32_t o : output) count += o == t;
    bool in_prompt = false;
    for (int32_t q : prompt) in_prompt |= q == t;
    if (count > 0 || in_prompt) {
      logits[t] = logits[t] > 0 ? logits[t] / p.repetition_penalty
                                : logits[t] * p.repetition_penalty;
    }
    logits[t] -= p.frequency_penalty * static_cast<float>(count);
    logits[t] -= p.presence_penalty * (count > 0 ? 1.0f : 0.0f);
  }
  return logits;
}

// SampleHistory as the planner builds it from the same tokens.
SampleHistory HistoryOf(const SamplingParams& p,
                        const std::vector<int32_t>& prompt,
                        const std::vector<int32_t>& output,
                        std::vector<int32_t> stop_tokens, int32_t min_tokens) {
  std::map<int32_t, int32_t> counts;
  if (p.repetition_penalty != 1.0f) {
    for (int32_t t : prompt) counts.emplace(t, 0);
  }
  for (int32_t t : output) ++counts[t];
  SampleHistory h;
  for (const auto& [t, c] : counts) {
    h.tokens.push_back(t);
    h.counts.push_back(c);
  }
  if (static_cast<int32_t>(output.size()) < min_tokens) {
    std::sort(stop_tokens.begin(), stop_tokens.end());
    h.masked = stop_tokens;
  }
  return h;
}

// Logits in eighths and penalties in quarters keep the penalties' sums
// exact, so the processed logits must equal the reference's bit for bit
// (the repetition penalty is one division or product on both sides).
std::vector<float> FixedLogits(int32_t vocab) {
  std::vector<float> logits(vocab);
  for (int32_t i = 0; i < vocab; ++i) {
    logits[i] = static_cast<float>((i * 37) % 61 - 30) / 8.0f;
  }
  return logits;
}

struct ProcessorCase {
  const char* name;
  SamplingParams params;
  int32_t min_tokens = 0;
};

std::vector<ProcessorCase> ProcessorCases() {
  return {
      {"off", {}},
      {"presence", {.presence_penalty = 1.5f}},
      {"negative presence", {.presence_penalty = -2.0f}},
      {"frequency", {.frequency_penalty = 0.75f}},
      {"presence and frequency",
       {.presence_penalty = 0.5f, .frequency_penalty = 2.0f}},
      {"repetition", {.repetition_penalty = 1.25f}},
      {"repetition under 1", {.repetition_penalty = 0.5f}},
      {"bias",
       {.logit_bias = {{.token = 2, .bias = 100},
                       {.token = 9, .bias = -100},
                       {.token = 60, .bias = 0.25f}}}},
      {"everything",
       {.presence_penalty = 0.25f,
        .frequency_penalty = -0.5f,
        .repetition_penalty = 2.0f,
        .logit_bias = {{.token = 4, .bias = 3.5f}, {.token = 7, .bias = -1}}},
       5},
      {"min_tokens", {}, 8},
  };
}

TEST(LogitProcessorsTest, MatchTheReferenceOnFixedLogits) {
  constexpr int32_t kVocab = 67;  // Awkward on purpose.
  const std::vector<int32_t> prompt = {3, 5, 5, 40, 66, 12};
  const std::vector<int32_t> output = {7, 12, 7, 7, 30, 0, 4};
  const std::vector<int32_t> stops = {9, 1};
  for (const ProcessorCase& c : ProcessorCases()) {
    SCOPED_TRACE(c.name);
    ASSERT_TRUE(ValidateSamplingParams(c.params).ok());
    const SampleHistory h =
        HistoryOf(c.params, prompt, output, stops, c.min_tokens);
    ASSERT_TRUE(ValidateSampleHistory(c.params, h, kVocab).ok());
    std::vector<float> got = FixedLogits(kVocab);
    ProcessLogits(absl::MakeSpan(got), c.params, h);
    const std::vector<float> want = ReferenceProcess(
        FixedLogits(kVocab), c.params, prompt, output, stops, c.min_tokens);
    for (int32_t t = 0; t < kVocab; ++t) ASSERT_EQ(got[t], want[t]) << t;
  }
}

// Greedy decoding takes the argmax of the processed logits, and seeded
// sampling draws from them: the same tokens as from the reference's, and
// different ones from the raw logits'.
TEST(LogitProcessorsTest, GreedyAndSeededSamplingUseTheProcessedLogits) {
  constexpr int32_t kVocab = 67;
  const std::vector<float> raw = FixedLogits(kVocab);
  // The raw argmax, generated three times already.
  const int32_t raw_best = SampleToken(raw, {}, 0);
  const std::vector<int32_t> prompt = {1, 2};
  const std::vector<int32_t> output = {raw_best, raw_best, raw_best};
  int changed = 0;
  for (const ProcessorCase& c : ProcessorCases()) {
    SCOPED_TRACE(c.name);
    const SampleHistory h =
        HistoryOf(c.params, prompt, output, {raw_best}, c.min_tokens);
    std::vector<float> got = raw;
    ProcessLogits(absl::MakeSpan(got), c.params, h);
    const std::vector<float> want = ReferenceProcess(
        raw, c.params, prompt, output, {raw_best}, c.min_tokens);
    SamplingParams greedy = c.params;
    EXPECT_EQ(SampleToken(got, greedy, 0), SampleToken(want, greedy, 0));
    changed += SampleToken(got, greedy, 0) != raw_best;
    for (uint64_t step = 0; step < 200; ++step) {
      SamplingParams p = c.params;
      p.temperature = 0.8f;
      p.top_p = 0.9f;
      p.seed = 11 + step % 3;
      ASSERT_EQ(SampleToken(got, p, step), SampleToken(want, p, step)) << step;
    }
  }
  // Positive presence and frequency penalties, repetition > 1, the +100
  // bias, the min_tokens mask and "everything" move the argmax off the
  // repeated token (7 cases).
  EXPECT_EQ(changed, 7);
}

TEST(LogitProcessorsTest, ABiasOfMinus100AndAMaskRemoveATokenFromSampling) {
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, 0.5f};
  SamplingParams p{.temperature = 1.0f,
                   .seed = 5,
                   .logit_bias = {{.token = 1, .bias = -100}}};
  SampleHistory h{.masked = {2}};
  std::vector<float> got = logits;
  ProcessLogits(absl::MakeSpan(got), p, h);
  EXPECT_EQ(got[2], -INFINITY);
  EXPECT_EQ(SampleToken(got, {}, 0), 0);  // Greedy.
  for (uint64_t step = 0; step < 2000; ++step) {
    const int32_t t = SampleToken(got, p, step);
    ASSERT_NE(t, 2) << step;  // Masked: never.
    // 1 has probability ~e^-98 of the rest.
    ASSERT_NE(t, 1) << step;
  }
}

TEST(LogitProcessorsTest, AnAllowedMaskLeavesOnlyItsTokens) {
  // 130 tokens (three mask words, the last partial); allowed: 3, 64, 129.
  std::vector<float> logits(130);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = float(i % 7);
  SampleHistory h{.allowed = {1ull << 3, 1ull << 0, 1ull << 1}};
  ASSERT_TRUE(ValidateSampleHistory({}, h, 130).ok());
  std::vector<float> got = logits;
  ProcessLogits(absl::MakeSpan(got), {}, h);
  for (size_t i = 0; i < got.size(); ++i) {
    if (i == 3 || i == 64 || i == 129) {
      EXPECT_EQ(got[i], logits[i]) << i;
    } else {
      EXPECT_EQ(got[i], -INFINITY) << i;
    }
  }
  const SamplingParams p{.temperature = 1.0f, .seed = 9};
  int seen[3] = {0, 0, 0};
  for (uint64_t step = 0; step < 600; ++step) {
    const int32_t t = SampleToken(got, p, step);
    ASSERT_TRUE(t == 3 || t == 64 || t == 129) << t;
    ++seen[t == 3 ? 0 : t == 64 ? 1 : 2];
  }
  for (int n : seen) EXPECT_GT(n, 0);
}

TEST(LogitProcessorsTest, ValidatesRangesAndHistories) {
  const auto kInvalid = absl::StatusCode::kInvalidArgument;
  EXPECT_TRUE(IsError(ValidateSamplingParams({.presence_penalty = 2.5f}),
                      kInvalid,
                      "presence_penalty must be in [-2, 2], got 2.5"));
  EXPECT_TRUE(IsError(ValidateSamplingParams({.frequency_penalty = NAN}),
                      kInvalid,
                      "frequency_penalty must be in [-2, 2], got nan"));
  EXPECT_TRUE(IsError(ValidateSamplingParams({.repetition_penalty = 0}),
                      kInvalid, "repetition_penalty must be > 0 and finite"));
  EXPECT_TRUE(IsError(
      ValidateSamplingParams({.logit_bias = {{.token = 3, .bias = -100.5f}}}),
      kInvalid, "logit_bias of token 3 must be in [-100, 100], got -100.5"));
  EXPECT_TRUE(IsError(
      ValidateSamplingParams({.logit_bias = {{.token = 3}, {.token = 3}}}),
      kInvalid, "distinct tokens in ascending order"));
  SamplingParams many;
  for (int32_t i = 0; i <= kMaxLogitBias; ++i) many.logit_bias.push_back({i});
  EXPECT_TRUE(IsError(ValidateSamplingParams(many), kInvalid,
                      "at most 300 logit_bias entries, got 301"));
  EXPECT_TRUE(
      IsError(ValidateSampleHistory({.logit_bias = {{.token = 10}}}, {}, 10),
              kInvalid, "logit_bias token 10 is outside the vocabulary of 10"));
  EXPECT_TRUE(IsError(ValidateSampleHistory({}, {.tokens = {1, 2}}, 10),
                      kInvalid, "2 tokens but 0 counts"));
  EXPECT_TRUE(IsError(
      ValidateSampleHistory({}, {.tokens = {2, 1}, .counts = {0, 0}}, 10),
      kInvalid, "distinct and ascending"));
  EXPECT_TRUE(IsError(ValidateSampleHistory({}, {.masked = {10}}, 10), kInvalid,
                      "outside the vocabulary of 10"));
  EXPECT_TRUE(
      IsError(ValidateSampleHistory({}, {.tokens = {1}, .counts = {-1}}, 10),
              kInvalid, "negative count"));
  EXPECT_TRUE(IsError(ValidateSampleHistory({}, {.allowed = {1, 1}}, 10),
                      kInvalid, "2 words for a vocabulary of 10"));
  EXPECT_TRUE(IsError(ValidateSampleHistory({}, {.allowed = {1ull << 10}}, 10),
                      kInvalid, "allows a token outside the vocabulary of 10"));
  EXPECT_TRUE(IsError(ValidateSampleHistory({}, {.allowed = {0}}, 10), kInvalid,
                      "allows no token"));
}

}  // namespace
}  // namespace shardlm
