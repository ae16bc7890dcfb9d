#include <cmath>

#include "kernels/check_args.h"
#include "kernels/rmsnorm/rmsnorm.h"
#include "kernels/threading.h"

namespace shardlm {

absl::Status RmsNorm(const Tensor& x, const Tensor& weight, float eps,
                     Tensor& out) {
  if (x.rank() != 2) return absl::InvalidArgumentError("RmsNorm: x not 2-D");
  const int64_t n = x.dim(0), d = x.dim(1);
  if (auto s = CheckHostF32("RmsNorm", "x", x, {n, d}); !s.ok()) return s;
  if (auto s = CheckHostF32("RmsNorm", "weight", weight, {d}); !s.ok()) {
    return s;
  }
  if (auto s = CheckHostF32("RmsNorm", "out", out, {n, d}); !s.ok()) return s;
  const float* w = weight.data<float>();
  ParallelForEach(n, n > 8, [&](int64_t i) {
    const float* xi = x.data<float>() + i * d;
    float* oi = out.data<float>() + i * d;
    double ss = 0;  // Double: d can be large and this sets every output.
    for (int64_t j = 0; j < d; ++j) ss += double{xi[j]} * xi[j];
    const float inv = static_cast<float>(1.0 / std::sqrt(ss / d + eps));
    for (int64_t j = 0; j < d; ++j) oi[j] = xi[j] * inv * w[j];
  });
  return absl::OkStatus();
}

}  // namespace shardlm
