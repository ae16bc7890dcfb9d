// bf16 GEMV for decode (y = x w^T at 1 to kGemvMaxRows rows): the step's
// largest cost at small batch is reading every weight once, and cuBLAS's
// GEMM kernels read a [out, in] bf16 matrix at 1.2-3.4 TB/s on an H200
// (split-K with a reduction kernel on some shapes). Here one warp streams
// one weight row with 16-byte loads, several in flight per lane, against
// the rows of x (read through L1: every warp of the SM reads the same x),
// with f32 sums and one warp reduction per row of x.
#include "kernels/cuda_common.cuh"

namespace shardlm::cuda {
namespace {

using Bf = __nv_bfloat16;
constexpr int kWarpsPerBlock = 8;
constexpr int kUnroll = 8;  // 16-byte loads in flight per lane.

template <int N, typename Out>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    GemvKernel(const Bf* x, const Bf* w, Out* y, int64_t in, int64_t out,
               bool accumulate) {
  const int lane = threadIdx.x % 32;
  const int64_t r =
      static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (r >= out) return;
  const uint4* wr = reinterpret_cast<const uint4*>(w + r * in);
  const int64_t vecs = in / 8;  // 16-byte pieces per row.
  float acc[N] = {};
  int64_t v = lane;
  // Whole rounds of kUnroll pieces per lane, their loads issued together.
  for (; v + (kUnroll - 1) * 32 < vecs; v += kUnroll * 32) {
    uint4 wv[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) wv[u] = __ldcs(wr + v + u * 32);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      float wf[8];
      UnpackBf16x8(wv[u], wf);
#pragma unroll
      for (int b = 0; b < N; ++b) {
        float xf[8];
        UnpackBf16x8(
            __ldg(reinterpret_cast<const uint4*>(x + b * in) + v + u * 32), xf);
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[b] += wf[e] * xf[e];
      }
    }
  }
  for (; v < vecs; v += 32) {
    float wf[8];
    UnpackBf16x8(__ldcs(wr + v), wf);
#pragma unroll
    for (int b = 0; b < N; ++b) {
      float xf[8];
      UnpackBf16x8(__ldg(reinterpret_cast<const uint4*>(x + b * in) + v), xf);
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[b] += wf[e] * xf[e];
    }
  }
#pragma unroll
  for (int b = 0; b < N; ++b) {
    const float sum = WarpSum(acc[b]);
    if (lane == 0) {
      const int64_t at = b * out + r;
      Store(y, at, accumulate ? Load(y, at) + sum : sum);
    }
  }
}

template <typename Out>
cudaError_t Launch(const Bf* x, const Bf* w, Out* y, int n, int64_t in,
                   int64_t out, bool accumulate, cudaStream_t stream) {
  const unsigned blocks = Blocks(out, kWarpsPerBlock);
  const int threads = kWarpsPerBlock * 32;
  switch (n) {
#define SHARDLM_GEMV_CASE(N)                                            \
  case N:                                                               \
    GemvKernel<N, Out>                                                  \
        <<<blocks, threads, 0, stream>>>(x, w, y, in, out, accumulate); \
    break;
    SHARDLM_GEMV_CASE(1)
    SHARDLM_GEMV_CASE(2)
    SHARDLM_GEMV_CASE(3)
    SHARDLM_GEMV_CASE(4)
    SHARDLM_GEMV_CASE(5)
    SHARDLM_GEMV_CASE(6)
    SHARDLM_GEMV_CASE(7)
    SHARDLM_GEMV_CASE(8)
#undef SHARDLM_GEMV_CASE
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t GemvBf16(const void* x, const void* w, void* y, Dt y_dt, int n,
                     int64_t in, int64_t out, bool accumulate,
                     cudaStream_t stream) {
  if (n == 0 || out == 0) return cudaSuccess;
  const auto* xb = static_cast<const Bf*>(x);
  const auto* wb = static_cast<const Bf*>(w);
  if (y_dt == Dt::kBF16) {
    return Launch(xb, wb, static_cast<Bf*>(y), n, in, out, accumulate, stream);
  }
  return Launch(xb, wb, static_cast<float*>(y), n, in, out, accumulate, stream);
}

}  // namespace shardlm::cuda
