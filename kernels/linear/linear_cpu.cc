#include <cblas.h>

#include "kernels/check_args.h"
#include "kernels/linear/linear.h"

namespace shardlm {

absl::Status Linear(const Tensor& x, const Tensor& w, Tensor& y,
                    bool accumulate) {
  if (x.rank() != 2 || w.rank() != 2) {
    return absl::InvalidArgumentError("Linear: x and w must be 2-D");
  }
  const int64_t n = x.dim(0), in = x.dim(1), out = w.dim(0);
  if (auto s = CheckHostF32("Linear", "w", w, {out, in}); !s.ok()) return s;
  if (auto s = CheckHostF32("Linear", "x", x, {n, in}); !s.ok()) return s;
  if (auto s = CheckHostF32("Linear", "y", y, {n, out}); !s.ok()) return s;
  const float beta = accumulate ? 1.0f : 0.0f;
  if (n == 1) {
    cblas_sgemv(CblasRowMajor, CblasNoTrans, out, in, 1.0f, w.data<float>(), in,
                x.data<float>(), 1, beta, y.data<float>(), 1);
  } else {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, out, in, 1.0f,
                x.data<float>(), in, w.data<float>(), in, beta, y.data<float>(),
                out);
  }
  return absl::OkStatus();
}

}  // namespace shardlm
