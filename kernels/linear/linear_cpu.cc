#include <cblas.h>
#include <omp.h>

#include <algorithm>

#include "kernels/check_args.h"
#include "kernels/linear/linear.h"

namespace shardlm {

// OpenBLAS runs single-threaded (see threading.cc); the output columns are
// split across the OpenMP team here instead, so that one pool of threads
// does all the work and BLAS threads never compete with OpenMP ones.
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
      if (n == 1) {
        cblas_sgemv(CblasRowMajor, CblasNoTrans, cols, in, 1.0f,
                    wp + begin * in, in, xp, 1, beta, yp + begin, 1);
      } else {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, cols, in, 1.0f,
                    xp, in, wp + begin * in, in, beta, yp + begin, out);
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace shardlm
