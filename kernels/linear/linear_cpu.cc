#include <cblas.h>
#include <omp.h>

#include <algorithm>

#include "core/status.h"
#include "kernels/batch_invariance.h"
#include "kernels/check_args.h"
#include "kernels/linear/linear.h"
#include "kernels/linear/quant_kernels.h"

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
#pragma omp parallel if (parallel)
  {
    const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    // Column ranges of 16 keep slices aligned for the BLAS kernels.
    const int64_t tiles = (out + 15) / 16;
    const int64_t begin = std::min(out, tiles * t / nt * 16);
    const int64_t end = std::min(out, tiles * (t + 1) / nt * 16);
    const int64_t cols = end - begin;
    if (cols > 0) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, cols, in, 1.0f,
                  xp, in, wp + begin * in, in, beta, yp + begin, out);
    }
  }
  return absl::OkStatus();
}

}  // namespace shardlm
