// Raw launchers of the quantized-weight kernels (linear_quant_cuda.cu),
// internal to shardlm_kernels_cuda like kernels/cuda_launch.h: callers use
// LinearQuantizedCuda / DequantizePackedCuda (kernels/cuda_ops.h), which
// validate first (CheckQuantGemvArgs, quant_device_pack.h). No Abseil.
#ifndef SHARDLM_KERNELS_LINEAR_LINEAR_QUANT_CUDA_H_
#define SHARDLM_KERNELS_LINEAR_LINEAR_QUANT_CUDA_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda_launch.h"
#include "kernels/linear/quant_device_layout.h"

namespace shardlm::cuda {

// y = x w^T (y += x w^T when accumulate) for 1 to 8 rows of x.
//   x: [n, in] bf16, 16-byte aligned  w: packed [out, in] of format `f`
//   (quant_device_layout.h), 16-byte aligned  y: [n, out] (y_dt)
// in a multiple of 32. One warp per output row reads the row's codes once
// for all n rows of x with 16-byte loads, dequantizes in registers and sums
// in f32.
cudaError_t GemvQuant(const void* x, const void* w, quant_layout::QuantFormat f,
                      void* y, Dt y_dt, int n, int64_t in, int64_t out,
                      bool accumulate, cudaStream_t stream);

// dst[r - row_begin, :] = row r of w as bf16 (the f32 value d * code
// rounded to nearest) for r in [row_begin, row_begin + rows). dst: [rows,
// in] bf16, 16-byte aligned.
cudaError_t DequantizePacked(const void* w, quant_layout::QuantFormat f,
                             int64_t out, int64_t in, int64_t row_begin,
                             int64_t rows, void* dst, cudaStream_t stream);

}  // namespace shardlm::cuda

#endif  // SHARDLM_KERNELS_LINEAR_LINEAR_QUANT_CUDA_H_
