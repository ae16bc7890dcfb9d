// The ranges of a generation request's numbers, one definition for both
// public APIs (issue 39: "HTTP and gRPC apply the same ranges to every
// field"). InferenceService checks every request with them; the HTTP API
// checks with them, in the same words, the values it must judge before a
// proto exists (an explicit max_tokens of 0 means "the default" in the
// proto but is an error in OpenAI's API; top_logprobs becomes logprobs).
#ifndef SHARDLM_API_REQUEST_RANGES_H_
#define SHARDLM_API_REQUEST_RANGES_H_

#include <cstdint>

#include "absl/status/status.h"
#include "step/sampling_params.h"

namespace shardlm {

// "max_tokens must be in [1, C] (the context window), got N".
absl::Status CheckMaxTokens(int64_t max_tokens, int64_t context_length);
// logprobs (completions) and top_logprobs (chat): [0, kMaxLogprobs].
absl::Status CheckLogprobs(int64_t logprobs);
// prompt_logprobs (gRPC's, and vLLM's HTTP extension): [0, kMaxLogprobs].
absl::Status CheckPromptLogprobs(int64_t prompt_logprobs);
// The engine's ranges (ValidateSamplingParams), in the API's words
// ("sampling: top_k must be >= 0, got -1"): temperature >= 0 and finite,
// top_k >= 0, top_p in (0, 1], presence and frequency penalties in [-2, 2],
// repetition_penalty > 0, at most kMaxLogitBias logit_bias entries, each in
// [-100, 100] for a token inside [0, vocab). `p` is as the engine takes it
// (the proto's 0 for top_p or repetition_penalty already made 1).
absl::Status CheckSampling(const SamplingParams& p, int64_t vocab);
// min_tokens in [0, max_tokens].
absl::Status CheckMinTokens(int64_t min_tokens, int64_t max_tokens);
// truncate_prompt_tokens >= 0 (0: off).
absl::Status CheckTruncatePromptTokens(int64_t n);

}  // namespace shardlm

#endif  // SHARDLM_API_REQUEST_RANGES_H_
