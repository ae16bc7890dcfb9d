// Device helpers shared by the .cu files: element loads/stores for f32 and
// bf16, warp and block reductions. Include only from .cu files.
#ifndef SHARDLM_KERNELS_CUDA_COMMON_CUH_
#define SHARDLM_KERNELS_CUDA_COMMON_CUH_

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda_launch.h"

namespace shardlm::cuda {

__device__ __forceinline__ float Load(const float* p, int64_t i) {
  return p[i];
}
__device__ __forceinline__ float Load(const __nv_bfloat16* p, int64_t i) {
  return __bfloat162float(p[i]);
}
__device__ __forceinline__ void Store(float* p, int64_t i, float v) {
  p[i] = v;
}
__device__ __forceinline__ void Store(__nv_bfloat16* p, int64_t i, float v) {
  p[i] = __float2bfloat16_rn(v);
}

__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float WarpMax(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, <= 1024); every thread
// gets the result. `scratch` holds 32 floats.
__device__ __forceinline__ float BlockSum(float v, float* scratch) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  v = WarpSum(v);
  __syncthreads();  // scratch may still be read by a previous call.
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  const int warps = blockDim.x / 32;
  v = lane < warps ? scratch[lane] : 0.0f;
  return WarpSum(v);
}

// The 8 bf16 values of one 16-byte load, as floats.
__device__ __forceinline__ void UnpackBf16x8(const uint4& raw, float f[8]) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 v = __bfloat1622float2(h[i]);
    f[2 * i] = v.x;
    f[2 * i + 1] = v.y;
  }
}

// RoPE pair k of a head of d elements at position `pos`: the pair's two
// elements (a, b), and the rotation's cos and sin. Angles in double, as on
// the CPU (rope_cpu.cc): positions reach 10^5 and more, where float angles
// lose the low bits that decide the rotation. inv_freq: [d / 2] f64 on the
// device, or null for theta^(-2k / d) (log_theta = log(theta)).
struct RopePair {
  int a, b;
  float cs, sn;
};
__device__ __forceinline__ RopePair RopePairAt(int pos, int k, int d,
                                               double log_theta,
                                               const double* inv_freq,
                                               double mscale, bool adjacent) {
  const int half = d / 2;
  const double f = inv_freq != nullptr
                       ? inv_freq[k]
                       : exp(-2.0 * static_cast<double>(k) / d * log_theta);
  double s, c;
  sincos(pos * f, &s, &c);
  // As the CPU: cos and sin scaled in double, then rounded to float.
  return {adjacent ? 2 * k : k, adjacent ? 2 * k + 1 : k + half,
          static_cast<float>(c * mscale), static_cast<float>(s * mscale)};
}

inline unsigned Blocks(int64_t count, int threads) {
  return static_cast<unsigned>((count + threads - 1) / threads);
}

}  // namespace shardlm::cuda

#endif  // SHARDLM_KERNELS_CUDA_COMMON_CUH_
