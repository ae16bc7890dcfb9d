// CUDA twin of rmsnorm_cpu.cc: one block per row, f32 sum of squares.
#include "kernels/cuda_common.cuh"

namespace shardlm::cuda {
namespace {

template <typename Out>
__global__ void RmsNormKernel(const float* x, const float* w, float eps,
                              int64_t d, Out* out) {
  __shared__ float scratch[32];
  const float* xi = x + blockIdx.x * d;
  float ss = 0.0f;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) ss += xi[j] * xi[j];
  ss = BlockSum(ss, scratch);
  const float inv = rsqrtf(ss / static_cast<float>(d) + eps);
  // Every read of xi is done (BlockSum synchronized), so out may alias x.
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
    Store(out, blockIdx.x * d + j, xi[j] * inv * w[j]);
  }
}

}  // namespace

cudaError_t RmsNorm(const float* x, const float* w, float eps, int64_t n,
                    int64_t d, void* out, Dt out_dt, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const int threads = d >= 1024 ? 1024 : 256;
  if (out_dt == Dt::kBF16) {
    RmsNormKernel<<<static_cast<unsigned>(n), threads, 0, stream>>>(
        x, w, eps, d, static_cast<__nv_bfloat16*>(out));
  } else {
    RmsNormKernel<<<static_cast<unsigned>(n), threads, 0, stream>>>(
        x, w, eps, d, static_cast<float*>(out));
  }
  return cudaGetLastError();
}

}  // namespace shardlm::cuda
