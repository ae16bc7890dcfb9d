#ifndef SHARDLM_KERNELS_ROPE_ROPE_H_
#define SHARDLM_KERNELS_ROPE_ROPE_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "core/tensor.h"
#include "model/model_config.h"

namespace shardlm {

// Rotary position embedding, in place. With r = 2 * table.inv_freq.size()
// rotary dimensions (head_dim, or fewer: partial RoPE, the rest unchanged),
// pair k of a head (k < r / 2) is rotated by angle positions[i] *
// table.inv_freq[k], its cos and sin scaled by table.mscale; the pair is
// (x[2k], x[2k+1]) for kAdjacentPairs and (x[k], x[k + r/2]) for
// kRotateHalf (see RopeStyle).
//   x: [n, heads, head_dim]  positions: [n]  table.inv_freq: [<= head_dim/2]
absl::Status Rope(Tensor& x, absl::Span<const int32_t> positions,
                  const RopeTable& table);
// Unscaled RoPE: inv_freq[k] = theta^(-2k / head_dim).
absl::Status Rope(Tensor& x, absl::Span<const int32_t> positions, float theta,
                  RopeStyle style);

}  // namespace shardlm

#endif  // SHARDLM_KERNELS_ROPE_ROPE_H_
