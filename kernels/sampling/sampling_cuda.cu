// Greedy sampling on the device: one block per logits row. (Stochastic
// sampling runs on the host with SampleToken; see kernels/cuda_ops.h.)
#include "kernels/cuda_common.cuh"

namespace shardlm::cuda {
namespace {

// (value, index) order: larger value first, then lower index.
__device__ __forceinline__ bool Better(float v, int32_t i, float bv,
                                       int32_t bi) {
  return v > bv || (v == bv && i < bi);
}

__global__ void ArgmaxKernel(const float* logits, int64_t vocab, int32_t* out) {
  __shared__ float sv[32];
  __shared__ int32_t si[32];
  const float* row = logits + blockIdx.x * vocab;
  float bv = -INFINITY;
  int32_t bi = 0x7fffffff;
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) {
    const float v = row[j];
    if (Better(v, static_cast<int32_t>(j), bv, bi)) {
      bv = v;
      bi = static_cast<int32_t>(j);
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
    const int32_t oi = __shfl_xor_sync(0xffffffffu, bi, o);
    if (Better(ov, oi, bv, bi)) {
      bv = ov;
      bi = oi;
    }
  }
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) {
    sv[warp] = bv;
    si[warp] = bi;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < static_cast<int>(blockDim.x / 32); ++w) {
      if (Better(sv[w], si[w], bv, bi)) {
        bv = sv[w];
        bi = si[w];
      }
    }
    // All -inf or NaN: index 0, as the CPU's Argmax.
    out[blockIdx.x] = bi == 0x7fffffff ? 0 : bi;
  }
}

}  // namespace

cudaError_t Argmax(const float* logits, int64_t rows, int64_t vocab,
                   int32_t* out, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  ArgmaxKernel<<<static_cast<unsigned>(rows), 1024, 0, stream>>>(logits, vocab,
                                                                 out);
  return cudaGetLastError();
}

}  // namespace shardlm::cuda
