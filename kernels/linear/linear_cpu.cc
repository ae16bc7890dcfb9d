#include <cblas.h>

#include <algorithm>

#include "core/status.h"
#include "kernels/batch_invariance.h"
#include "kernels/check_args.h"
#include "kernels/linear/linear.h"
#include "kernels/linear/quant_kernels.h"
#include "kernels/threading.h"

namespace shardlm {

// Steps of up to kDecodeMaxRows rows (and every step, batch-invariant) run
// the same row dot products as quantized weights (quant_kernels.h): a
// row's sums do not depend on how many rows share its step, which
// OpenBLAS's GEMV and GEMM do not promise. Larger steps run OpenBLAS's
// GEMM. OpenBLAS runs single-threaded (see threading.cc); the output
// columns are split across the OpenMP team here instead, so that one pool
// of threads does all the work and BLAS threads never compete with OpenMP
// ones.
absl::Status Linear(const Tensor& x, const Tensor& w, Tensor& y,
                    bool accumulate) {
  if (x.rank() != 2 || w.rank() != 2) {
    return absl::InvalidArgumentError("Linear: x and w must be 2-D");
  }
  if (IsQuantized(w.dtype())) return LinearQuantized(x, w, y, accumulate);
  const int64_t n = x.dim(0), in = x.dim(1), out = w.dim(0);
  if (auto s = CheckHostF32("Linear", "w", w, {out, in}); !s.ok()) return s;
  if (auto s = CheckHostF32("Linear", "x", x, {n, in}); !s.ok()) return s;
  if (auto s = CheckHostF32("Linear", "y", y, {n, out}); !s.ok()) return s;
  const float beta = accumulate ? 1.0f : 0.0f;
  const float* xp = x.data<float>();
  const float* wp = w.data<float>();
  float* yp = y.data<float>();
  if (n <= kDecodeMaxRows || BatchInvariant()) {
    ASSIGN_OR_RETURN(const quant_kernels::Kernels kernels,
                     quant_kernels::ForActiveIsa(DType::kF32));
    quant_kernels::LinearByRowDots(kernels,
                                   reinterpret_cast<const uint8_t*>(wp),
                                   in * static_cast<int64_t>(sizeof(float)), in,
                                   xp, n, in, out, yp, accumulate);
    return absl::OkStatus();
  }
  // Small products are not worth waking the team for.
  const bool parallel = n * out * in >= (int64_t{1} << 16);
  // Column ranges of whole tiles of 16 keep slices aligned for the BLAS
  // kernels.
  const auto columns = [&](int64_t begin, int64_t end) {
    if (end > begin) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, end - begin, in,
                  1.0f, xp, in, wp + begin * in, in, beta, yp + begin, out);
    }
  };
  if (!parallel) {
    columns(0, out);
    return absl::OkStatus();
  }
  ParallelFor((out + 15) / 16, [&](int64_t t0, int64_t t1) {
    columns(t0 * 16, std::min(out, t1 * 16));
  });
  return absl::OkStatus();
}

}  // namespace shardlm
