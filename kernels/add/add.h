#ifndef SHARDLM_KERNELS_ADD_ADD_H_
#define SHARDLM_KERNELS_ADD_ADD_H_

#include "absl/status/status.h"
#include "core/tensor.h"

namespace shardlm {

// x += y, elementwise (residual connections). x, y: same shape.
absl::Status AddInPlace(Tensor& x, const Tensor& y);

// x[i, :] += bias for every row i (a projection's bias). x: [n, c],
// bias: [c].
absl::Status AddBias(Tensor& x, const Tensor& bias);

}  // namespace shardlm

#endif  // SHARDLM_KERNELS_ADD_ADD_H_
