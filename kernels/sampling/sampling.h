// Token sampling from logits: greedy, temperature, top-k, top-p, seeded.
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

// Picks a token from `logits` (one row, the full vocabulary). Greedy picks
// the lowest index among equal maxima.
int32_t SampleToken(absl::Span<const float> logits,
                    const SamplingParams& params, uint64_t step);

}  // namespace shardlm

#endif  // SHARDLM_KERNELS_SAMPLING_SAMPLING_H_
