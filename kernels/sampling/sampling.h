// Token sampling from logits: greedy, temperature, top-k, top-p, seeded.
#ifndef SHARDLM_KERNELS_SAMPLING_SAMPLING_H_
#define SHARDLM_KERNELS_SAMPLING_SAMPLING_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace shardlm {

struct SamplingParams {
  float temperature = 0.0f;  // 0 means greedy (argmax).
  int32_t top_k = 0;         // Keep the k most likely tokens; 0 is off.
  float top_p = 1.0f;        // Keep the smallest set with mass >= p; 1 is off.
  uint64_t seed = 0;

  friend bool operator==(const SamplingParams&,
                         const SamplingParams&) = default;
};

// InvalidArgument naming the field when a value is out of range.
absl::Status ValidateSamplingParams(const SamplingParams& params);

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
