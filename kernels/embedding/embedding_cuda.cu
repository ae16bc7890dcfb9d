// CUDA twin of embedding_cpu.cc: a gather of table rows.
#include <algorithm>

#include "kernels/cuda_common.cuh"

namespace shardlm::cuda {
namespace {

template <typename T>
__global__ void EmbeddingKernel(const T* table, const int32_t* ids, int64_t n,
                                int64_t rows, int64_t hidden,
                                int64_t vocab_begin, float* out) {
  const int64_t i = blockIdx.x;  // x: up to 2^31 - 1 tokens (y: 65535).
  const int64_t row = static_cast<int64_t>(ids[i]) - vocab_begin;
  const bool in = row >= 0 && row < rows;
  for (int64_t j = blockIdx.y * int64_t{blockDim.x} + threadIdx.x; j < hidden;
       j += int64_t{gridDim.y} * blockDim.x) {
    out[i * hidden + j] = in ? Load(table, row * hidden + j) : 0.0f;
  }
}

}  // namespace

cudaError_t Embedding(const void* table, Dt table_dt, const int32_t* ids,
                      int64_t n, int64_t rows, int64_t hidden,
                      int64_t vocab_begin, float* out, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const int threads = 256;
  const dim3 grid(static_cast<unsigned>(n),
                  std::min(Blocks(hidden, threads), 65535u));
  if (table_dt == Dt::kBF16) {
    EmbeddingKernel<<<grid, threads, 0, stream>>>(
        static_cast<const __nv_bfloat16*>(table), ids, n, rows, hidden,
        vocab_begin, out);
  } else {
    EmbeddingKernel<<<grid, threads, 0, stream>>>(
        static_cast<const float*>(table), ids, n, rows, hidden, vocab_begin,
        out);
  }
  return cudaGetLastError();
}

}  // namespace shardlm::cuda
