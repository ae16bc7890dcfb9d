// SampleStep with logit processors: each row samples from its processed
// logits (ProcessLogits, checked against a reference in
// kernels/sampling/sampling_test.cc), its log-probabilities are of those
// logits, the logits returned stay the model's, and a bad history is
// refused.
#include "worker/sample_step.h"

#include <cmath>
#include <memory>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/sampling/sampling.h"
#include "step/late_masks.h"
#include "testing/status.h"

namespace shardlm {
namespace {

using testing_util::IsError;

constexpr int64_t kVocab = 37;

Tensor Logits(int64_t rows) {
  Tensor t = Tensor::Host(DType::kF32, {rows, kVocab}).value();
  for (int64_t i = 0; i < rows * kVocab; ++i) {
    t.f32()[i] = std::sin(0.7f * static_cast<float>(i)) * 4.0f;
  }
  return t;
}

// Two rows: one with every processor, one plain.
StepInput TwoRows() {
  StepInput s;
  s.logit_rows = {0, 1};
  s.sampling = {SamplingParams{.temperature = 0,
                               .presence_penalty = 1.0f,
                               .frequency_penalty = 0.5f,
                               .repetition_penalty = 1.3f,
                               .logit_bias = {{.token = 4, .bias = -100},
                                              {.token = 20, .bias = 2}}},
                SamplingParams{.temperature = 0.7f, .seed = 9}};
  s.sample_index = {3, 5};
  s.history = {{.tokens = {2, 7, 11}, .counts = {0, 3, 1}, .masked = {5}}, {}};
  s.logprobs = {3, 2};
  s.return_logits = true;
  return s;
}

TEST(SampleStepTest, RowsSampleFromTheirProcessedLogits) {
  const StepInput step = TwoRows();
  const Tensor raw = Logits(2);
  ASSERT_OK_AND_ASSIGN(StepOutput out, SampleStep(step, Logits(2)));
  ASSERT_EQ(out.tokens.size(), 2u);
  ASSERT_EQ(out.logprobs.size(), 2u);
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE(r);
    std::vector<float> row(raw.f32().begin() + r * kVocab,
                           raw.f32().begin() + (r + 1) * kVocab);
    ProcessLogits(absl::MakeSpan(row), step.sampling[r], step.history[r]);
    EXPECT_EQ(out.tokens[r],
              SampleToken(row, step.sampling[r], step.sample_index[r]));
    const TokenLogprobs want = Logprobs(row, out.tokens[r], step.logprobs[r]);
    EXPECT_EQ(out.logprobs[r].sampled, want.sampled);
    ASSERT_EQ(out.logprobs[r].top.size(), want.top.size());
    for (size_t i = 0; i < want.top.size(); ++i) {
      EXPECT_EQ(out.logprobs[r].top[i].token, want.top[i].token);
      EXPECT_EQ(out.logprobs[r].top[i].logprob, want.top[i].logprob);
    }
  }
  // Row 0's masked and -100-biased tokens are out of its alternatives.
  for (const TokenLogprob& t : out.logprobs[0].top) {
    EXPECT_NE(t.token, 5);
    EXPECT_NE(t.token, 4);
  }
  // The logits returned are the model's.
  for (int64_t i = 0; i < 2 * kVocab; ++i) {
    ASSERT_EQ(out.logits.f32()[i], raw.f32()[i]) << i;
  }
}

TEST(SampleStepTest, ScoredRowsReportTheirTokenAndDrawNothing) {
  // Row 0 scores token 7 (a prompt position), row 1 samples as before.
  StepInput step = TwoRows();
  step.sampling[0] = SamplingParams{};
  step.history[0] = {};
  step.score_tokens = {7, -1};
  const Tensor raw = Logits(2);
  ASSERT_OK_AND_ASSIGN(StepOutput out, SampleStep(step, Logits(2)));
  ASSERT_EQ(out.tokens.size(), 2u);
  EXPECT_EQ(out.tokens[0], 7);
  const std::vector<float> row0(raw.f32().begin(), raw.f32().begin() + kVocab);
  const TokenLogprobs want = Logprobs(row0, 7, 3);
  EXPECT_EQ(out.logprobs[0].sampled, want.sampled);
  ASSERT_EQ(out.logprobs[0].top.size(), 3u);
  EXPECT_EQ(out.logprobs[0].top[0].token, want.top[0].token);
  const std::vector<float> row1(raw.f32().begin() + kVocab,
                                raw.f32().begin() + 2 * kVocab);
  EXPECT_EQ(out.tokens[1], SampleToken(row1, step.sampling[1], 5));

  step.score_tokens = {kVocab, -1};
  EXPECT_TRUE(IsError(SampleStep(step, Logits(2)),
                      absl::StatusCode::kInvalidArgument,
                      "score token 37 is outside the vocabulary of 37"));
  step.score_tokens = {1};
  EXPECT_TRUE(IsError(ValidateStepSampling(step),
                      absl::StatusCode::kInvalidArgument,
                      "2 logit rows but 1 score tokens"));
}

// Masks that arrive after the step was submitted (a constrained row's,
// computed while the forward pass runs): SampleStep waits for them, then
// samples as from the same step with the masks in its histories, min_tokens
// yielding where the mask allows only a masked token.
TEST(SampleStepTest, LateMasksAreWaitedForAndApplied) {
  StepInput step = TwoRows();
  step.history[0].masked = {5, 30};  // min_tokens' stop tokens.
  const auto only = [](std::vector<int32_t> ids) {
    std::vector<uint64_t> mask((kVocab + 63) / 64, 0);
    for (int32_t t : ids) mask[t >> 6] |= uint64_t{1} << (t & 63);
    return mask;
  };
  // Row 0: the grammar allows only 30, a stop token (the output is
  // complete), so min_tokens yields; row 1: two tokens to choose from.
  StepInput want = step;
  want.history[0].allowed = only({30});
  want.history[0].masked.clear();
  want.history[1].allowed = only({3, 11});
  ASSERT_OK_AND_ASSIGN(const StepOutput expected, SampleStep(want, Logits(2)));
  EXPECT_EQ(expected.tokens[0], 30);
  EXPECT_TRUE(expected.tokens[1] == 3 || expected.tokens[1] == 11);

  auto masks = std::make_shared<LateMasks>();
  step.late_masks = masks;
  absl::StatusOr<StepOutput> out;
  // Sampled on another thread, as a runner does; the masks come after.
  std::thread sampler([&] { out = SampleStep(step, Logits(2)); });
  masks->Set(
      {{.row = 0, .allowed = only({30})}, {.row = 1, .allowed = only({3, 11})}},
      0.25);
  sampler.join();
  ASSERT_OK(out.status());
  EXPECT_EQ(out->tokens, expected.tokens);
  ASSERT_EQ(out->logprobs.size(), 2u);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(out->logprobs[r].sampled, expected.logprobs[r].sampled);
  }
  EXPECT_EQ(masks->compute_seconds(), 0.25);
  EXPECT_GE(masks->waited_seconds(), 0.0);
}

TEST(SampleStepTest, RefusesABadHistory) {
  const auto kInvalid = absl::StatusCode::kInvalidArgument;
  StepInput step = TwoRows();
  step.history.pop_back();
  EXPECT_TRUE(IsError(ValidateStepSampling(step), kInvalid,
                      "2 logit rows but 1 sample histories"));
  step = TwoRows();
  step.history[0].masked = {kVocab};
  EXPECT_TRUE(IsError(SampleStep(step, Logits(2)), kInvalid,
                      "outside the vocabulary of 37"));
  step = TwoRows();
  step.sampling[1].logit_bias = {{.token = kVocab, .bias = 1}};
  EXPECT_TRUE(IsError(SampleStep(step, Logits(2)), kInvalid,
                      "logit_bias token 37 is outside the vocabulary of 37"));
  step = TwoRows();
  step.sampling[0].presence_penalty = 3;
  EXPECT_TRUE(IsError(ValidateStepSampling(step), kInvalid,
                      "presence_penalty must be in [-2, 2], got 3"));
}

}  // namespace
}  // namespace shardlm
