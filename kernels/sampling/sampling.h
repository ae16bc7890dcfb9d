// Token sampling from logits: the logit processors (penalties, bias,
// masks), then greedy, temperature, top-k, top-p, seeded.
#ifndef SHARDLM_KERNELS_SAMPLING_SAMPLING_H_
#define SHARDLM_KERNELS_SAMPLING_SAMPLING_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "step/sampling_params.h"

namespace shardlm {

// The uniform draw in [0, 1) for token number `step` of a request seeded
// with `seed`. A pure function of (seed, step) rather than a stateful
// generator, so that any worker, a retry or a recomputation after
// preemption draws exactly the same number.
double SampleUniform(uint64_t seed, uint64_t step);

// Applies a row's logit processors to `logits` (one row, [vocab], in
// place), in vLLM's order: logit_bias is added and the masked tokens (and
// those outside history.allowed, when it is given) set to -inf, then the
// repetition penalty (on the biased logits) divides positive logits and
// multiplies the others of every token in history.tokens, then logit[t] -=
// presence * (count[t] > 0) + frequency * count[t]. Nothing changes when no
// processor is on and nothing is masked. `history` must be valid for the row
// (ValidateSampleHistory).
void ProcessLogits(absl::Span<float> logits, const SamplingParams& params,
                   const SampleHistory& history);

// Picks a token from `logits` (one row, the full vocabulary). Greedy picks
// the lowest index among equal maxima.
int32_t SampleToken(absl::Span<const float> logits,
                    const SamplingParams& params, uint64_t step);

}  // namespace shardlm

#endif  // SHARDLM_KERNELS_SAMPLING_SAMPLING_H_
