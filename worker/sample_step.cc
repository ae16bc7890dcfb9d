#include "worker/sample_step.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "kernels/sampling/sampling.h"
#include "step/late_masks.h"

namespace shardlm {

TokenLogprobs Logprobs(absl::Span<const float> logits, int32_t sampled,
                       int32_t top_n) {
  const int64_t vocab = static_cast<int64_t>(logits.size());
  double max = -INFINITY;
  for (float l : logits) max = std::max<double>(max, l);
  double sum = 0;
  for (float l : logits) sum += std::exp(static_cast<double>(l) - max);
  const double log_z = max + std::log(sum);
  const auto logprob = [&](int32_t t) {
    return static_cast<float>(static_cast<double>(logits[t]) - log_z);
  };
  TokenLogprobs out;
  out.sampled = logprob(sampled);
  std::vector<int32_t> ids(vocab);
  std::iota(ids.begin(), ids.end(), 0);
  const int64_t n = std::min<int64_t>(top_n, vocab);
  std::partial_sort(
      ids.begin(), ids.begin() + n, ids.end(), [&](int32_t a, int32_t b) {
        return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
      });
  for (int64_t i = 0; i < n; ++i) out.top.push_back({ids[i], logprob(ids[i])});
  return out;
}

absl::Status ValidateStepSampling(const StepInput& step) {
  const size_t rows = step.logit_rows.size();
  if (step.sampling.size() != rows || step.sample_index.size() != rows) {
    return absl::InvalidArgumentError(
        absl::StrCat("step has ", rows, " logit rows but ",
                     step.sampling.size(), " sampling parameters and ",
                     step.sample_index.size(), " sample indices"));
  }
  if (!step.logprobs.empty() && step.logprobs.size() != rows) {
    return absl::InvalidArgumentError(
        absl::StrCat("step has ", rows, " logit rows but ",
                     step.logprobs.size(), " logprobs counts"));
  }
  for (int32_t n : step.logprobs) {
    if (n < 0 || n > kMaxLogprobs) {
      return absl::InvalidArgumentError(
          absl::StrCat("logprobs must be in [0, ", kMaxLogprobs, "], got ", n));
    }
  }
  if (!step.score_tokens.empty() && step.score_tokens.size() != rows) {
    return absl::InvalidArgumentError(
        absl::StrCat("step has ", rows, " logit rows but ",
                     step.score_tokens.size(), " score tokens"));
  }
  if (!step.history.empty() && step.history.size() != rows) {
    return absl::InvalidArgumentError(
        absl::StrCat("step has ", rows, " logit rows but ", step.history.size(),
                     " sample histories"));
  }
  for (const SamplingParams& p : step.sampling) {
    RETURN_IF_ERROR(ValidateSamplingParams(p));
  }
  return absl::OkStatus();
}

absl::StatusOr<StepOutput> SampleStep(const StepInput& step, Tensor logits) {
  RETURN_IF_ERROR(ValidateStepSampling(step));
  const size_t rows = step.logit_rows.size();
  StepOutput out;
  if (rows == 0) return out;
  const int64_t vocab = logits.dim(1);
  const bool any_logprobs =
      std::any_of(step.logprobs.begin(), step.logprobs.end(),
                  [](int32_t n) { return n > 0; });
  if (any_logprobs) out.logprobs.resize(rows);
  for (int32_t t : step.score_tokens) {
    if (t < -1 || t >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat(
          "score token ", t, " is outside the vocabulary of ", vocab));
    }
  }
  // Constrained rows' masks may still be in the making (late_masks.h):
  // waited for here, after the forward pass.
  const std::vector<SampleHistory> histories = ResolvedHistory(step);
  const SampleHistory no_history;
  std::vector<float> processed;  // A row with logit processors, processed.
  for (size_t r = 0; r < rows; ++r) {
    const SamplingParams& params = step.sampling[r];
    const SampleHistory& history =
        histories.empty() ? no_history : histories[r];
    absl::Span<const float> row(logits.f32().data() + r * vocab, vocab);
    // On a copy: the logits returned (return_logits) stay the model's.
    if (params.HasLogitProcessors() || !history.empty()) {
      RETURN_IF_ERROR(ValidateSampleHistory(params, history, vocab));
      processed.assign(row.begin(), row.end());
      ProcessLogits(absl::MakeSpan(processed), params, history);
      row = processed;
    }
    const int32_t score = step.score_tokens.empty() ? -1 : step.score_tokens[r];
    out.tokens.push_back(
        score >= 0 ? score : SampleToken(row, params, step.sample_index[r]));
    if (any_logprobs && step.logprobs[r] > 0) {
      out.logprobs[r] = Logprobs(row, out.tokens.back(), step.logprobs[r]);
    }
  }
  if (step.return_logits) out.logits = std::move(logits);
  return out;
}

}  // namespace shardlm
