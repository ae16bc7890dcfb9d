// CUDA twin of rope_cpu.cc, both pair conventions, with a RopeTable's
// frequencies (RoPE scaling) or theta^(-2k/d) (the rotation: RopePairAt in
// cuda_common.cuh, which the fused QKV kernel shares).
#include "kernels/cuda_common.cuh"

namespace shardlm::cuda {
namespace {

__global__ void RopeKernel(float* x, const int32_t* positions, int64_t n,
                           int64_t heads, int64_t d, double log_theta,
                           const double* inv_freq, double mscale,
                           bool adjacent) {
  const int64_t half = d / 2;
  const int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (idx >= n * heads * half) return;
  const int64_t row = idx / half;  // token * heads + head
  const RopePair r =
      RopePairAt(positions[row / heads], static_cast<int>(idx % half),
                 static_cast<int>(d), log_theta, inv_freq, mscale, adjacent);
  float* v = x + row * d;
  const float x0 = v[r.a], x1 = v[r.b];
  v[r.a] = x0 * r.cs - x1 * r.sn;
  v[r.b] = x0 * r.sn + x1 * r.cs;
}

}  // namespace

cudaError_t Rope(float* x, const int32_t* positions, int64_t n, int64_t heads,
                 int64_t d, float theta, const double* inv_freq, double mscale,
                 bool adjacent_pairs, cudaStream_t stream) {
  const int64_t count = n * heads * (d / 2);
  if (count == 0) return cudaSuccess;
  const int threads = 256;
  RopeKernel<<<Blocks(count, threads), threads, 0, stream>>>(
      x, positions, n, heads, d, log(static_cast<double>(theta)), inv_freq,
      mscale, adjacent_pairs);
  return cudaGetLastError();
}

}  // namespace shardlm::cuda
