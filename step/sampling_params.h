// A request's sampling parameters, as every part of the system passes them
// (the API layers, the scheduler, the step contract, the sampling kernels).
#ifndef SHARDLM_STEP_SAMPLING_PARAMS_H_
#define SHARDLM_STEP_SAMPLING_PARAMS_H_

#include <cstdint>

#include "absl/status/status.h"

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

}  // namespace shardlm

#endif  // SHARDLM_STEP_SAMPLING_PARAMS_H_
