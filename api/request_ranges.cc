#include "api/request_ranges.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "step/step.h"

namespace shardlm {

absl::Status CheckMaxTokens(int64_t max_tokens, int64_t context_length) {
  if (max_tokens >= 1 && max_tokens <= context_length) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("max_tokens must be in [1, ", context_length,
                   "] (the context window), got ", max_tokens));
}

absl::Status CheckLogprobs(int64_t logprobs) {
  if (logprobs >= 0 && logprobs <= kMaxLogprobs) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "logprobs must be in [0, ", kMaxLogprobs, "], got ", logprobs));
}

absl::Status CheckPromptLogprobs(int64_t prompt_logprobs) {
  if (prompt_logprobs >= 0 && prompt_logprobs <= kMaxLogprobs) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("prompt_logprobs must be in [0, ", kMaxLogprobs, "], got ",
                   prompt_logprobs));
}

absl::Status CheckSampling(const SamplingParams& p, int64_t vocab) {
  if (!std::isfinite(p.temperature) || !std::isfinite(p.top_p)) {
    return absl::InvalidArgumentError(
        "sampling.temperature and sampling.top_p must be finite");
  }
  absl::Status s = ValidateSamplingParams(p);
  if (s.ok()) s = ValidateSampleHistory(p, SampleHistory{}, vocab);
  if (!s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("sampling: ", s.message()));
  }
  return absl::OkStatus();
}

absl::Status CheckMinTokens(int64_t min_tokens, int64_t max_tokens) {
  if (min_tokens >= 0 && min_tokens <= max_tokens) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("min_tokens must be in [0, max_tokens = ", max_tokens,
                   "], got ", min_tokens));
}

absl::Status CheckTruncatePromptTokens(int64_t n) {
  if (n >= 0) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("truncate_prompt_tokens must be >= 0 (0: off), got ", n));
}

}  // namespace shardlm
