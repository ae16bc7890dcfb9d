// CUDA twin of swiglu_cpu.cc, plus the other elementwise ops the GPU path
// needs (residual add, bias add, f32 <-> bf16 casts, seeded random fill),
// kept in one translation unit to bound nvcc time.
#include "kernels/cuda_common.cuh"

namespace shardlm::cuda {
namespace {

template <typename Out>
__global__ void SwiGluKernel(const float* gate, const float* up, int64_t count,
                             Out* out) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i >= count) return;
  const float g = gate[i];
  Store(out, i, g / (1.0f + expf(-g)) * up[i]);
}

template <typename Out>
__global__ void SwiGluFusedKernel(const float* gate_up, int64_t n, int64_t f,
                                  Out* out) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i >= n * f) return;
  const int64_t row = i / f, col = i % f;
  const float g = gate_up[row * 2 * f + col];
  Store(out, i, g / (1.0f + expf(-g)) * gate_up[row * 2 * f + f + col]);
}

__global__ void SplitQkvKernel(const float* qkv, int64_t n, int64_t qd,
                               int64_t kd, float* q, float* k, float* v) {
  const int64_t width = qd + 2 * kd;
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i >= n * width) return;
  const int64_t row = i / width, col = i % width;
  const float x = qkv[i];
  if (col < qd) {
    q[row * qd + col] = x;
  } else if (col < qd + kd) {
    k[row * kd + col - qd] = x;
  } else {
    v[row * kd + col - qd - kd] = x;
  }
}

__global__ void AddKernel(float* x, const float* y, int64_t count) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i < count) x[i] += y[i];
}

__global__ void AddBiasKernel(float* x, const float* bias, int64_t count,
                              int64_t c) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i < count) x[i] += bias[i % c];
}

template <typename In, typename Out>
__global__ void CastKernel(const In* src, Out* dst, int64_t count) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i < count) Store(dst, i, Load(src, i));
}

__device__ __forceinline__ uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

template <typename T>
__global__ void FillRandomKernel(T* dst, int64_t count, uint64_t seed,
                                 float scale) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i >= count) return;
  const uint64_t bits = Mix(seed ^ Mix(static_cast<uint64_t>(i)));
  const float u = static_cast<float>(bits >> 40) * 0x1.0p-24f;  // [0, 1)
  Store(dst, i, (2.0f * u - 1.0f) * scale);
}

constexpr int kThreads = 256;

}  // namespace

cudaError_t SwiGlu(const float* gate, const float* up, int64_t count, void* out,
                   Dt out_dt, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  if (out_dt == Dt::kBF16) {
    SwiGluKernel<<<Blocks(count, kThreads), kThreads, 0, stream>>>(
        gate, up, count, static_cast<__nv_bfloat16*>(out));
  } else {
    SwiGluKernel<<<Blocks(count, kThreads), kThreads, 0, stream>>>(
        gate, up, count, static_cast<float*>(out));
  }
  return cudaGetLastError();
}

cudaError_t SwiGluFused(const float* gate_up, int64_t n, int64_t f, void* out,
                        Dt out_dt, cudaStream_t stream) {
  const int64_t count = n * f;
  if (count == 0) return cudaSuccess;
  if (out_dt == Dt::kBF16) {
    SwiGluFusedKernel<<<Blocks(count, kThreads), kThreads, 0, stream>>>(
        gate_up, n, f, static_cast<__nv_bfloat16*>(out));
  } else {
    SwiGluFusedKernel<<<Blocks(count, kThreads), kThreads, 0, stream>>>(
        gate_up, n, f, static_cast<float*>(out));
  }
  return cudaGetLastError();
}

cudaError_t SplitQkv(const float* qkv, int64_t n, int64_t qd, int64_t kd,
                     float* q, float* k, float* v, cudaStream_t stream) {
  const int64_t count = n * (qd + 2 * kd);
  if (count == 0) return cudaSuccess;
  SplitQkvKernel<<<Blocks(count, kThreads), kThreads, 0, stream>>>(qkv, n, qd,
                                                                   kd, q, k, v);
  return cudaGetLastError();
}

cudaError_t Add(float* x, const float* y, int64_t count, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  AddKernel<<<Blocks(count, kThreads), kThreads, 0, stream>>>(x, y, count);
  return cudaGetLastError();
}

cudaError_t AddBias(float* x, const float* bias, int64_t n, int64_t c,
                    cudaStream_t stream) {
  const int64_t count = n * c;
  if (count == 0) return cudaSuccess;
  AddBiasKernel<<<Blocks(count, kThreads), kThreads, 0, stream>>>(x, bias,
                                                                  count, c);
  return cudaGetLastError();
}

cudaError_t Cast(const void* src, Dt src_dt, void* dst, Dt dst_dt,
                 int64_t count, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  const unsigned blocks = Blocks(count, kThreads);
  using Bf = __nv_bfloat16;
  if (src_dt == Dt::kF32 && dst_dt == Dt::kBF16) {
    CastKernel<<<blocks, kThreads, 0, stream>>>(static_cast<const float*>(src),
                                                static_cast<Bf*>(dst), count);
  } else if (src_dt == Dt::kBF16 && dst_dt == Dt::kF32) {
    CastKernel<<<blocks, kThreads, 0, stream>>>(
        static_cast<const Bf*>(src), static_cast<float*>(dst), count);
  } else {
    const size_t bytes = count * (src_dt == Dt::kF32 ? 4 : 2);
    return cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream);
  }
  return cudaGetLastError();
}

cudaError_t FillRandom(void* dst, Dt dt, int64_t count, uint64_t seed,
                       float scale, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  const unsigned blocks = Blocks(count, kThreads);
  if (dt == Dt::kBF16) {
    FillRandomKernel<<<blocks, kThreads, 0, stream>>>(
        static_cast<__nv_bfloat16*>(dst), count, seed, scale);
  } else {
    FillRandomKernel<<<blocks, kThreads, 0, stream>>>(static_cast<float*>(dst),
                                                      count, seed, scale);
  }
  return cudaGetLastError();
}

}  // namespace shardlm::cuda
