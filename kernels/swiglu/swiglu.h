#ifndef SHARDLM_KERNELS_SWIGLU_SWIGLU_H_
#define SHARDLM_KERNELS_SWIGLU_SWIGLU_H_

#include "absl/status/status.h"
#include "core/tensor.h"

namespace shardlm {

// out = silu(gate) * up, elementwise; silu(g) = g / (1 + exp(-g)).
//   gate, up, out: [n, f] (out may be gate or up)
absl::Status SwiGlu(const Tensor& gate, const Tensor& up, Tensor& out);

}  // namespace shardlm

#endif  // SHARDLM_KERNELS_SWIGLU_SWIGLU_H_
