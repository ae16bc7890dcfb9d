// Q8_0 / Q4_0 weights kept in their blocks on the device (issue #43 part
// 4; layout: quant_device_layout.h). Decode at batch 1-8 reads every weight
// once per step, so its time is the weight bytes over the HBM bandwidth:
// 1.0625 (Q8_0) or 0.5625 (Q4_0) bytes a weight here against bf16's 2.
//
// GemvQuant: one warp per output row, as the bf16 GEMV
// (linear_cuda.cu): each lane takes 16-byte units of the row's codes
// (half a Q8_0 block, a whole Q4_0 block), kUnroll of them in flight, with
// their blocks' f16 scales; it turns the codes into floats without
// integer conversions (DecodeUnit) and multiplies them into the rows of x
// (bf16, read through L1: every warp of the SM reads the same x) in f32,
// scales the unit's sum once, and the warp reduces at the end. The index
// arithmetic is quant_device_layout.h's, which the host reference
// (DequantizePacked in quant_device_pack.cc) shares.
//
// DequantizePacked: one thread per unit writes its 16 or 32 values as bf16
// with 16-byte stores (prefill: a chunk of rows for a cuBLAS GEMM).
//
// Not run on a GPU yet (kernels_cross_backend_test and gpu_decode_bench
// have its checks and figures).
#include <cuda_fp16.h>

#include "kernels/cuda_common.cuh"
#include "kernels/linear/linear_quant_cuda.h"

namespace shardlm::cuda {
namespace {

namespace ql = quant_layout;
using Bf = __nv_bfloat16;
using ql::QuantFormat;

constexpr int kWarpsPerBlock = 8;
// 16-byte units in flight per lane: 4 for one row of x (few registers,
// many warps per SM), 2 for up to 8 (98 registers; also half the code,
// which every binary carries for two architectures).
template <int N>
constexpr int kUnroll = N == 1 ? 4 : 2;

// acc[b] += d * sum_e code[e] * x[b, first + e] over one unit's values,
// for the n <= N rows of x.
template <int N, QuantFormat F>
__device__ __forceinline__ void Unit(const uint4& raw, float d, const Bf* x,
                                     int n, int64_t in, int64_t first,
                                     float acc[N]) {
  constexpr int kElems = F == QuantFormat::kQ8_0 ? 16 : 32;
  float w[kElems];
  ql::DecodeUnit(F, raw.x, raw.y, raw.z, raw.w, w);
#pragma unroll
  for (int b = 0; b < N; ++b) {
    if (b >= n) break;  // The same for the whole warp.
    const uint4* xv = reinterpret_cast<const uint4*>(x + b * in + first);
    float sum = 0.0f;
#pragma unroll
    for (int v = 0; v < kElems / 8; ++v) {
      float xf[8];
      UnpackBf16x8(__ldg(xv + v), xf);
#pragma unroll
      for (int e = 0; e < 8; ++e) sum += w[8 * v + e] * xf[e];
    }
    acc[b] += d * sum;
  }
}

// N: 1, 2, 4 or 8 rows of x held in registers, n <= N of them used (a
// kernel per row count would quadruple the code every binary carries).
template <int N, QuantFormat F>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    GemvQuantKernel(const Bf* x, const uint8_t* w, void* y, bool y_bf16, int n,
                    int64_t in, int64_t out, bool accumulate) {
  const int lane = threadIdx.x % 32;
  const int64_t r =
      static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (r >= out) return;
  const uint4* q =
      reinterpret_cast<const uint4*>(w + ql::QuantOffset(F, in, r, 0));
  const __half* s =
      reinterpret_cast<const __half*>(w + ql::ScaleOffset(F, out, in, r, 0));
  const int64_t units = ql::UnitsPerRow(F, in);
  float acc[N] = {};
  int64_t u = lane;
  // Whole rounds of kUnroll units per lane, their loads issued together.
  for (; u + (kUnroll<N> - 1) * 32 < units; u += kUnroll<N> * 32) {
    uint4 raw[kUnroll<N>];
    float d[kUnroll<N>];
#pragma unroll
    for (int k = 0; k < kUnroll<N>; ++k) {
      raw[k] = __ldcs(q + u + k * 32);
      d[k] = __half2float(__ldg(s + ql::UnitBlock(F, u + k * 32)));
    }
#pragma unroll
    for (int k = 0; k < kUnroll<N>; ++k) {
      Unit<N, F>(raw[k], d[k], x, n, in, ql::UnitFirstElem(F, u + k * 32), acc);
    }
  }
  for (; u < units; u += 32) {
    const uint4 raw = __ldcs(q + u);
    const float d = __half2float(__ldg(s + ql::UnitBlock(F, u)));
    Unit<N, F>(raw, d, x, n, in, ql::UnitFirstElem(F, u), acc);
  }
#pragma unroll
  for (int b = 0; b < N; ++b) {
    if (b >= n) break;
    const float sum = WarpSum(acc[b]);
    if (lane == 0) {
      const int64_t at = b * out + r;
      if (y_bf16) {
        Bf* yb = static_cast<Bf*>(y);
        Store(yb, at, accumulate ? Load(yb, at) + sum : sum);
      } else {
        float* yf = static_cast<float*>(y);
        Store(yf, at, accumulate ? Load(yf, at) + sum : sum);
      }
    }
  }
}

template <QuantFormat F>
__global__ void __launch_bounds__(256)
    DequantizeKernel(const uint8_t* w, int64_t out, int64_t in,
                     int64_t row_begin, int64_t rows, Bf* dst) {
  constexpr int kElems = F == QuantFormat::kQ8_0 ? 16 : 32;
  const int64_t per_row = ql::UnitsPerRow(F, in);
  const int64_t total = rows * per_row;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < total; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / per_row, u = i % per_row, row = row_begin + r;
    const uint4 raw = __ldcs(
        reinterpret_cast<const uint4*>(w + ql::QuantOffset(F, in, row, 0)) + u);
    const float d = __half2float(*reinterpret_cast<const __half*>(
        w + ql::ScaleOffset(F, out, in, row, ql::UnitBlock(F, u))));
    float c[kElems];
    ql::DecodeUnit(F, raw.x, raw.y, raw.z, raw.w, c);
    uint4* o = reinterpret_cast<uint4*>(dst + r * in + ql::UnitFirstElem(F, u));
#pragma unroll
    for (int v = 0; v < kElems / 8; ++v) {
      uint4 pack;
      __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&pack);
#pragma unroll
      for (int p = 0; p < 4; ++p) {
        const int e = 8 * v + 2 * p;
        h[p] = __floats2bfloat162_rn(d * c[e], d * c[e + 1]);
      }
      o[v] = pack;
    }
  }
}

template <QuantFormat F>
cudaError_t LaunchGemv(const Bf* x, const uint8_t* w, void* y, bool y_bf16,
                       int n, int64_t in, int64_t out, bool accumulate,
                       cudaStream_t stream) {
  const unsigned blocks = Blocks(out, kWarpsPerBlock);
  const int threads = kWarpsPerBlock * 32;
  if (n == 1) {
    GemvQuantKernel<1, F><<<blocks, threads, 0, stream>>>(x, w, y, y_bf16, n,
                                                          in, out, accumulate);
  } else if (n <= 8) {
    GemvQuantKernel<8, F><<<blocks, threads, 0, stream>>>(x, w, y, y_bf16, n,
                                                          in, out, accumulate);
  } else {
    return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t GemvQuant(const void* x, const void* w, QuantFormat f, void* y,
                      Dt y_dt, int n, int64_t in, int64_t out, bool accumulate,
                      cudaStream_t stream) {
  if (n == 0 || out == 0) return cudaSuccess;
  if (in % ql::kBlockElems != 0) return cudaErrorInvalidValue;
  const auto* xb = static_cast<const Bf*>(x);
  const auto* wq = static_cast<const uint8_t*>(w);
  const bool y_bf16 = y_dt == Dt::kBF16;
  if (f == QuantFormat::kQ8_0) {
    return LaunchGemv<QuantFormat::kQ8_0>(xb, wq, y, y_bf16, n, in, out,
                                          accumulate, stream);
  }
  return LaunchGemv<QuantFormat::kQ4_0>(xb, wq, y, y_bf16, n, in, out,
                                        accumulate, stream);
}

cudaError_t DequantizePacked(const void* w, QuantFormat f, int64_t out,
                             int64_t in, int64_t row_begin, int64_t rows,
                             void* dst, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  if (in % ql::kBlockElems != 0) return cudaErrorInvalidValue;
  const int64_t units = rows * ql::UnitsPerRow(f, in);
  constexpr int kThreads = 256;
  const unsigned blocks =
      Blocks(units < (int64_t{1} << 27) ? units : int64_t{1} << 27, kThreads);
  const auto* wq = static_cast<const uint8_t*>(w);
  auto* d = static_cast<Bf*>(dst);
  if (f == QuantFormat::kQ8_0) {
    DequantizeKernel<QuantFormat::kQ8_0>
        <<<blocks, kThreads, 0, stream>>>(wq, out, in, row_begin, rows, d);
  } else {
    DequantizeKernel<QuantFormat::kQ4_0>
        <<<blocks, kThreads, 0, stream>>>(wq, out, in, row_begin, rows, d);
  }
  return cudaGetLastError();
}

}  // namespace shardlm::cuda
