#ifndef SHARDLM_KERNELS_ROPE_ROPE_H_
#define SHARDLM_KERNELS_ROPE_ROPE_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "core/tensor.h"
#include "model/model_config.h"

namespace shardlm {

// Rotary position embedding, in place. Pair k of a head (k < head_dim / 2)
// is rotated by angle positions[i] * theta^(-2k / head_dim); the pair is
// (x[2k], x[2k+1]) for kAdjacentPairs and (x[k], x[k + head_dim/2]) for
// kRotateHalf (see RopeStyle).
//   x: [n, heads, head_dim]  positions: [n]
absl::Status Rope(Tensor& x, absl::Span<const int32_t> positions, float theta,
                  RopeStyle style);

}  // namespace shardlm

#endif  // SHARDLM_KERNELS_ROPE_ROPE_H_
