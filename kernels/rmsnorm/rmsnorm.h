#ifndef SHARDLM_KERNELS_RMSNORM_RMSNORM_H_
#define SHARDLM_KERNELS_RMSNORM_RMSNORM_H_

#include "absl/status/status.h"
#include "core/tensor.h"

namespace shardlm {

// out[i, :] = x[i, :] / sqrt(mean(x[i, :]^2) + eps) * weight
//   x: [n, d]  weight: [d]  out: [n, d] (may be x itself)
absl::Status RmsNorm(const Tensor& x, const Tensor& weight, float eps,
                     Tensor& out);

}  // namespace shardlm

#endif  // SHARDLM_KERNELS_RMSNORM_RMSNORM_H_
