#ifndef SHARDLM_KERNELS_LINEAR_LINEAR_H_
#define SHARDLM_KERNELS_LINEAR_LINEAR_H_

#include "absl/status/status.h"
#include "core/tensor.h"

namespace shardlm {

// y = x * w^T, or y += x * w^T when `accumulate`.
//   x: [n, in] f32  w: [out, in] (row-major, as stored in model files): f32,
//   or Q8_0 / Q4_0 / Q4_1 blocks read in place (linear_quantized_cpu.cc)
//   y: [n, out] f32
absl::Status Linear(const Tensor& x, const Tensor& w, Tensor& y,
                    bool accumulate = false);

// The quantized path of Linear (w in a block format). Steps of up to
// kDecodeMaxRows rows of x read each row of w once for all of them, as
// matrix-vector products whose result for a row of x is exactly the one it
// gets alone; larger ones dequantize w into tiles for a GEMM. The vector
// code is kernels/cpu_isa.h's choice (SetCpuIsa to compare them).
constexpr int64_t kDecodeMaxRows = 16;
absl::Status LinearQuantized(const Tensor& x, const Tensor& w, Tensor& y,
                             bool accumulate);

}  // namespace shardlm

#endif  // SHARDLM_KERNELS_LINEAR_LINEAR_H_
