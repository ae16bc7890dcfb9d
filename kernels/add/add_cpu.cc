#include "absl/strings/str_cat.h"
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

absl::Status AddBias(Tensor& x, const Tensor& bias) {
  if (x.rank() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("AddBias: x is ", x.DebugString(), "; expected [n, c]"));
  }
  const int64_t n = x.dim(0), c = x.dim(1);
  if (auto s = CheckHostF32("AddBias", "x", x, {n, c}); !s.ok()) return s;
  if (auto s = CheckHostF32("AddBias", "bias", bias, {c}); !s.ok()) return s;
  float* a = x.data<float>();
  const float* b = bias.data<float>();
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < c; ++j) a[i * c + j] += b[j];
  }
  return absl::OkStatus();
}

}  // namespace shardlm
