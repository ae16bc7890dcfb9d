// CUDA twins of the experts' row ops (worker/forward.h GatherRows and
// ScatterAddRows, the CPU's in worker/cpu_forward_ops.cc): an expert's
// tokens gathered into contiguous rows for its GEMMs, and its output rows
// added back, weighted, into the tokens' partial sums. The row lists come
// from the host (routing is on the host), by value in the launch's
// arguments: no device buffer, no copy to order against the stream.
#include "kernels/cuda_common.cuh"

namespace shardlm::cuda {
namespace {

// One thread block per listed row; threads stride over its elements.
template <typename T>
__global__ void GatherRowsKernel(const T* x, int64_t c, ExpertRows rows,
                                 T* out) {
  const T* src = x + int64_t{rows.row[blockIdx.x]} * c;
  T* dst = out + int64_t{blockIdx.x} * c;
  for (int64_t j = threadIdx.x; j < c; j += blockDim.x) dst[j] = src[j];
}

// Rows of one launch are distinct (checked by the caller): no two blocks
// write the same element.
__global__ void ScatterAddRowsKernel(const float* y, int64_t c, ExpertRows rows,
                                     float* out) {
  const float* src = y + int64_t{blockIdx.x} * c;
  float* dst = out + int64_t{rows.row[blockIdx.x]} * c;
  const float w = rows.weight[blockIdx.x];
  for (int64_t j = threadIdx.x; j < c; j += blockDim.x) dst[j] += w * src[j];
}

constexpr int kThreads = 256;

}  // namespace

cudaError_t GatherRows(const void* x, Dt dt, int64_t c, const ExpertRows& rows,
                       void* out, cudaStream_t stream) {
  if (rows.count == 0 || c == 0) return cudaSuccess;
  if (dt == Dt::kBF16) {
    GatherRowsKernel<<<rows.count, kThreads, 0, stream>>>(
        static_cast<const __nv_bfloat16*>(x), c, rows,
        static_cast<__nv_bfloat16*>(out));
  } else {
    GatherRowsKernel<<<rows.count, kThreads, 0, stream>>>(
        static_cast<const float*>(x), c, rows, static_cast<float*>(out));
  }
  return cudaGetLastError();
}

cudaError_t ScatterAddRows(const float* y, int64_t c, const ExpertRows& rows,
                           float* out, cudaStream_t stream) {
  if (rows.count == 0 || c == 0) return cudaSuccess;
  ScatterAddRowsKernel<<<rows.count, kThreads, 0, stream>>>(y, c, rows, out);
  return cudaGetLastError();
}

}  // namespace shardlm::cuda
