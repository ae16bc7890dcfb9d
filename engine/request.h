// What a request to the engine is, and how it reports back: shared by the
// scheduler, the planner behind it and the API layers.
#ifndef SHARDLM_ENGINE_REQUEST_H_
#define SHARDLM_ENGINE_REQUEST_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/serving_metrics.h"
#include "grammar/token_constraint.h"
#include "kernels/sampling/sampling.h"
#include "step/step.h"

namespace shardlm {

struct GenerateRequest {
  std::vector<int32_t> prompt;  // Token ids; at least one.
  // Tokens generated earlier (a resumed stream, GenerateRequest's
  // resume_token_ids): the sequence goes on after them as if it had
  // generated them (max_tokens, min_tokens, penalties and the sampler's
  // draw index count them); on_token and the result see only later ones.
  std::vector<int32_t> resumed;
  int32_t max_tokens = 16;
  SamplingParams sampling;
  std::vector<int32_t> stop_token_ids;  // Generation ends after one of these.
  // The stop tokens cannot be sampled until this many tokens have been
  // generated (0 to max_tokens).
  int32_t min_tokens = 0;
  bool return_prompt_logits = false;  // Logits at the last prompt position.
  // Per generated token: its log-probability and those of the `logprobs`
  // most likely tokens (0: none; at most kMaxLogprobs).
  int32_t logprobs = 0;
  // Per prompt token after the first: its log-probability given the tokens
  // before it and those of the `prompt_logprobs` most likely tokens there
  // (0: none; at most kMaxLogprobs), from the prefill's own logits. Such a
  // request computes its whole prompt (no prefix cache hit).
  int32_t prompt_logprobs = 0;
  // Waiting requests are admitted highest priority first, then in arrival
  // order.
  int32_t priority = 0;
  // A request not finished by then ends with DeadlineExceeded.
  absl::Time deadline = absl::InfiniteFuture();
  // Where it came from (a label of the request metrics).
  RequestApi api = RequestApi::kDirect;
  // Whether the server's speculative decoding (--speculative) may draft
  // for it; false opts out. Drafting never changes the tokens.
  bool speculative = true;
  // Structured outputs: when set, each token is sampled from those it
  // allows (the planner ships its mask with the row) and then given to it.
  // Owned by this request alone (not shared with another request).
  std::shared_ptr<TokenConstraint> constraint;
};

enum class FinishReason { kLength, kStop, kCancelled };
const char* FinishReasonName(FinishReason r);

struct GenerateResult {
  std::vector<int32_t> tokens;  // Generated tokens (including a stop token).
  FinishReason finish_reason = FinishReason::kLength;
  std::vector<float> prompt_logits;  // When asked for: [vocab].
  double prefill_seconds = 0;        // From submission to the first token.
  double decode_seconds = 0;         // From the first to the last token.
  // When asked for (request.logprobs > 0): one per generated token.
  std::vector<TokenLogprobs> logprobs;
  // When asked for (request.prompt_logprobs > 0): one per prompt token
  // after the first.
  std::vector<TokenLogprobs> prompt_logprobs;
  // Prompt tokens whose KV the prefix cache held when the request first
  // started (not computed for it); later recomputations do not change it.
  int64_t cached_prompt_tokens = 0;
};

// What on_token wants done with its request after a token: go on, end it
// as finished (kStop, e.g. a stop string was seen) or as cancelled. Either
// end frees its blocks at once.
enum class TokenAction { kContinue, kStop, kCancel };

// How a submitted request reports back. Both run on the scheduler's loop
// thread (or, for on_done of a request never started, the thread that ends
// the scheduler), never under the scheduler's lock, so they may call
// Submit() and Cancel(). They should be quick: the whole batch waits.
struct RequestCallbacks {
  // Each generated token, in order, with its log-probabilities (null
  // unless the request asked for them; valid during the call only).
  std::function<TokenAction(int32_t token, const TokenLogprobs* logprobs)>
      on_token;
  // With prompt_logprobs: once, before the first on_token, with them all.
  std::function<void(const std::vector<TokenLogprobs>& prompt_logprobs)>
      on_prompt_logprobs;
  // Exactly once, last: the result (finish_reason kCancelled when
  // cancelled, kStop when on_token said kStop), or the error that ended the
  // request (DeadlineExceeded, a failed step's status, Unavailable when the
  // scheduler shuts down).
  std::function<void(absl::StatusOr<GenerateResult>)> on_done;
};

using RequestId = int64_t;

}  // namespace shardlm

#endif  // SHARDLM_ENGINE_REQUEST_H_
