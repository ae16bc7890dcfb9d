// A request's sampling parameters, as every part of the system passes them
// (the API layers, the scheduler, the step contract, the sampling kernels),
// and what one sampled row needs of its sequence's tokens (SampleHistory).
#ifndef SHARDLM_STEP_SAMPLING_PARAMS_H_
#define SHARDLM_STEP_SAMPLING_PARAMS_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"

namespace shardlm {

// Most logit_bias entries a request may carry (as OpenAI's API).
inline constexpr int32_t kMaxLogitBias = 300;

struct LogitBias {
  int32_t token = 0;
  float bias = 0;  // In [-100, 100].
  friend bool operator==(const LogitBias&, const LogitBias&) = default;
};

struct SamplingParams {
  float temperature = 0.0f;  // 0 means greedy (argmax).
  int32_t top_k = 0;         // Keep the k most likely tokens; 0 is off.
  float top_p = 1.0f;        // Keep the smallest set with mass >= p; 1 is off.
  uint64_t seed = 0;
  // OpenAI's penalties, over the tokens generated so far (count[t] times
  // each): logit[t] -= presence * (count[t] > 0) + frequency * count[t].
  // In [-2, 2]; 0 is off.
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  // vLLM's: the logit of every token of the prompt or the output is divided
  // by it when positive, multiplied by it otherwise. > 0; 1 is off.
  float repetition_penalty = 1.0f;
  // Added to the logits: distinct tokens in ascending order, each bias in
  // [-100, 100], at most kMaxLogitBias entries (ids are checked against the
  // vocabulary where it is known: the API and the sampling rank).
  std::vector<LogitBias> logit_bias;

  // Whether any of the logit processors above is on (the logits sampled
  // from are then not the model's).
  bool HasLogitProcessors() const {
    return presence_penalty != 0.0f || frequency_penalty != 0.0f ||
           repetition_penalty != 1.0f || !logit_bias.empty();
  }

  friend bool operator==(const SamplingParams&,
                         const SamplingParams&) = default;
};

// What the penalties and min_tokens of one sampled row need of its
// sequence, carried by the step (not kept on the sampling rank), so that a
// row's token stays a pure function of the step: any rank, a retry or a
// recomputation after preemption or a rejoin samples alike.
struct SampleHistory {
  // Distinct tokens the penalties apply to, ascending: those generated so
  // far, plus the prompt's when repetition_penalty != 1.
  std::vector<int32_t> tokens;
  // Per token: how many times it was generated (0: in the prompt only).
  std::vector<int32_t> counts;
  // Tokens that may not be sampled at this row (logit -inf): the stop
  // tokens while fewer than min_tokens have been generated. Ascending.
  std::vector<int32_t> masked;
  // Empty, or the only tokens that may be sampled at this row (structured
  // outputs: the tokens that extend the grammar's valid prefix, and the
  // stop tokens once it is complete), as (vocab + 63) / 64 words, bit
  // t % 64 of word t / 64 for token t. Computed by the coordinator, which
  // follows each constrained sequence's grammar state, so the sampler
  // needs no grammar.
  std::vector<uint64_t> allowed;

  bool empty() const {
    return tokens.empty() && masked.empty() && allowed.empty();
  }
  friend bool operator==(const SampleHistory&, const SampleHistory&) = default;
};

// InvalidArgument naming the field when a value is out of range.
absl::Status ValidateSamplingParams(const SamplingParams& params);

// InvalidArgument when `history` is malformed (unsorted or repeated ids,
// counts of the wrong length or negative, an allowed mask of the wrong
// size or allowing no token) or names a token outside [0, vocab); also
// checks params.logit_bias's ids against `vocab`.
absl::Status ValidateSampleHistory(const SamplingParams& params,
                                   const SampleHistory& history, int64_t vocab);

}  // namespace shardlm

#endif  // SHARDLM_STEP_SAMPLING_PARAMS_H_
