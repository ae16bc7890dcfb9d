#ifndef SHARDLM_KERNELS_SOFTMAX_SOFTMAX_H_
#define SHARDLM_KERNELS_SOFTMAX_SOFTMAX_H_

#include <cstdint>

namespace shardlm {

// In-place, numerically stable softmax of x[0, n). -inf entries become 0;
// n must be > 0 and at least one entry finite.
void SoftmaxInPlace(float* x, int64_t n);

}  // namespace shardlm

#endif  // SHARDLM_KERNELS_SOFTMAX_SOFTMAX_H_
