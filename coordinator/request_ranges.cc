#include "coordinator/request_ranges.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "step/sampling_params.h"
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

absl::Status CheckSampling(float temperature, int32_t top_k, float top_p) {
  if (!std::isfinite(temperature) || !std::isfinite(top_p)) {
    return absl::InvalidArgumentError(
        "sampling.temperature and sampling.top_p must be finite");
  }
  const SamplingParams p{.temperature = temperature,
                         .top_k = top_k,
                         .top_p = top_p == 0.0f ? 1.0f : top_p};
  if (absl::Status s = ValidateSamplingParams(p); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("sampling: ", s.message()));
  }
  return absl::OkStatus();
}

absl::Status CheckTruncatePromptTokens(int64_t n) {
  if (n >= 0) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("truncate_prompt_tokens must be >= 0 (0: off), got ", n));
}

}  // namespace shardlm
