#include "kernels/add/add.h"
#include "kernels/check_args.h"

namespace shardlm {

absl::Status AddInPlace(Tensor& x, const Tensor& y) {
  if (auto s = CheckHostF32("AddInPlace", "x", x, x.shape()); !s.ok()) return s;
  if (auto s = CheckHostF32("AddInPlace", "y", y, x.shape()); !s.ok()) return s;
  float* a = x.data<float>();
  const float* b = y.data<float>();
  const int64_t n = x.numel();
  for (int64_t i = 0; i < n; ++i) a[i] += b[i];
  return absl::OkStatus();
}

}  // namespace shardlm
