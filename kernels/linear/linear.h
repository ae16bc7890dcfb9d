#ifndef SHARDLM_KERNELS_LINEAR_LINEAR_H_
#define SHARDLM_KERNELS_LINEAR_LINEAR_H_

#include "absl/status/status.h"
#include "core/tensor.h"

namespace shardlm {

// y = x * w^T, or y += x * w^T when `accumulate`.
//   x: [n, in]  w: [out, in] (row-major, as stored in model files)
//   y: [n, out]
absl::Status Linear(const Tensor& x, const Tensor& w, Tensor& y,
                    bool accumulate = false);

}  // namespace shardlm

#endif  // SHARDLM_KERNELS_LINEAR_LINEAR_H_
