// How much one step and the queue may hold: the scheduler's limits, which
// the executors also size their step buffers for (GPU activations).
#ifndef SHARDLM_STEP_BATCH_LIMITS_H_
#define SHARDLM_STEP_BATCH_LIMITS_H_

#include <cstdint>

#include "absl/status/status.h"

namespace shardlm {

struct BatchLimits {
  // Most tokens in one step; longer prompts are prefilled in chunks.
  int32_t max_batched_tokens = 512;
  int32_t max_seqs = 64;  // Most sequences running at once.
  // Most requests waiting for admission (beyond it: ResourceExhausted).
  int32_t max_queued = 256;

  // InvalidArgument naming the field (as its flag) when out of range.
  absl::Status Validate() const;
};

}  // namespace shardlm

#endif  // SHARDLM_STEP_BATCH_LIMITS_H_
