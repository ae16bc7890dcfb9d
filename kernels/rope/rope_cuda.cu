// CUDA twin of rope_cpu.cc, both pair conventions, with a RopeTable's
// frequencies (RoPE scaling) or theta^(-2k/d). Angles in double, as on the
// CPU: positions reach 10^5 and more, where float angles lose the low bits
// that decide the rotation.
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
  const int64_t k = idx % half;
  const int64_t row = idx / half;  // token * heads + head
  const int64_t i = row / heads;
  const double f = inv_freq != nullptr
                       ? inv_freq[k]
                       : exp(-2.0 * static_cast<double>(k) / d * log_theta);
  double s, c;
  sincos(positions[i] * f, &s, &c);
  // As the CPU: cos and sin scaled in double, then rounded to float.
  const float cs = static_cast<float>(c * mscale);
  const float sn = static_cast<float>(s * mscale);
  float* v = x + row * d;
  const int64_t a = adjacent ? 2 * k : k;
  const int64_t b = adjacent ? 2 * k + 1 : k + half;
  const float x0 = v[a], x1 = v[b];
  v[a] = x0 * cs - x1 * sn;
  v[b] = x0 * sn + x1 * cs;
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
