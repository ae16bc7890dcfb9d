#include <algorithm>
#include <cmath>

#include "kernels/softmax/softmax.h"

namespace shardlm {

void SoftmaxInPlace(float* x, int64_t n) {
  const float max = *std::max_element(x, x + n);
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - max);
    sum += x[i];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

}  // namespace shardlm
