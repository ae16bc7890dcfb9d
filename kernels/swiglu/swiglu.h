#ifndef SHARDLM_KERNELS_SWIGLU_SWIGLU_H_
#define SHARDLM_KERNELS_SWIGLU_SWIGLU_H_

#include "absl/status/status.h"
#include "core/tensor.h"

namespace shardlm {

// out = silu(gate) * up, elementwise; silu(g) = g / (1 + exp(-g)).
//   gate, up, out: [n, f] (out may be gate or up)
absl::Status SwiGlu(const Tensor& gate, const Tensor& up, Tensor& out);

// out = gelu(gate) * up with GELU's tanh approximation (Gemma's GeGLU,
// transformers' gelu_pytorch_tanh): gelu(g) = g/2 (1 + tanh(sqrt(2/pi)
// (g + 0.044715 g^3))). Shapes as SwiGlu's.
absl::Status GeGlu(const Tensor& gate, const Tensor& up, Tensor& out);

}  // namespace shardlm

#endif  // SHARDLM_KERNELS_SWIGLU_SWIGLU_H_
