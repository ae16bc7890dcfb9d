#include "worker/cuda_forward_ops.h"

#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "backend/cuda_status.h"
#include "core/status.h"
#include "kernels/linear/quant_device_pack.h"

namespace shardlm {

absl::Status CudaForwardOps::Embed(const Tensor& table, int64_t vocab_begin,
                                   Tensor& x) {
  return EmbeddingCuda(table, ids_, vocab_begin, x, exec_);
}

absl::Status CudaForwardOps::RmsNorm(const Tensor& x, const Tensor& weight,
                                     float eps, Tensor& out) {
  return RmsNormCuda(x, weight, eps, out, exec_);
}

absl::Status CudaForwardOps::Linear(const Tensor& x, const Tensor& w, Tensor& y,
                                    bool accumulate) {
  if (HasDeviceQuantLayout(w.dtype())) {
    // A packed Q8_0 / Q4_0 matrix (--cuda-weights quantized): the quantized
    // GEMV for decode steps of up to 8 rows, else chunks of it dequantized
    // into the rank's scratch (reserved at upload) for cuBLAS.
    if (x.rank() == 2 && x.dim(0) <= kQuantGemvMaxRows) {
      return LinearQuantizedCuda(x, w, y, accumulate, exec_);
    }
    return LinearPackedCuda(x, w, y, accumulate, DequantScratchCuda(exec_),
                            exec_);
  }
  return LinearCuda(x, w, y, accumulate, exec_);
}

absl::Status CudaForwardOps::Rope(Tensor& x, const RopeTable& rope) {
  if (static_cast<int64_t>(rope.inv_freq.size()) != rope_.pairs ||
      rope.style != rope_.style) {
    return absl::InternalError("RoPE table differs from the uploaded one");
  }
  return RopeCuda(x, batch_.positions(), rope_, exec_);
}

absl::Status CudaForwardOps::WriteKv(const Tensor& k, const Tensor& v,
                                     const KvLayer& cache) {
  return WriteKvCuda(k, v, batch_, cache.k, cache.v, exec_, cache.k_host,
                     cache.v_host);
}

absl::Status CudaForwardOps::Attention(const Tensor& q, const KvLayer& cache,
                                       const LayerAttention& layer,
                                       Tensor& out) {
  if (layer.softcap != 0) {
    return absl::UnimplementedError(
        "soft-capped attention scores (Gemma 2) on CUDA");
  }
  // The layer's window (Qwen2's differ by layer) over the step's batch.
  return PagedAttentionCuda(q, cache.k, cache.v, batch_, layer.scale, out,
                            exec_, AttentionKernel::kAuto, /*splits=*/0,
                            cache.k_host, cache.v_host, layer.window,
                            &attention_workspace_);
}

absl::Status CudaForwardOps::SwiGlu(const Tensor& gate, const Tensor& up,
                                    Tensor& out) {
  return SwiGluCuda(gate, up, out, exec_);
}

absl::Status CudaForwardOps::Add(Tensor& x, const Tensor& y) {
  return AddInPlaceCuda(x, y, exec_);
}

absl::Status CudaForwardOps::AddBias(Tensor& x, const Tensor& bias) {
  return AddBiasCuda(x, bias, exec_);
}

absl::Status CudaForwardOps::SplitQkv(const Tensor& qkv, Tensor& q, Tensor& k,
                                      Tensor& v) {
  return SplitQkvCuda(qkv, q, k, v, exec_);
}

absl::Status CudaForwardOps::QkvRopeKv(const Tensor& qkv, const RopeTable& rope,
                                       Tensor& q, Tensor& k, Tensor& v,
                                       const KvLayer& cache) {
  if (static_cast<int64_t>(rope.inv_freq.size()) != rope_.pairs ||
      rope.style != rope_.style) {
    return absl::InternalError("RoPE table differs from the uploaded one");
  }
  return QkvRopeWriteKvCuda(qkv, batch_, rope_, q, cache.k, cache.v, exec_,
                            cache.k_host, cache.v_host);
}

absl::Status CudaForwardOps::SwiGluFused(const Tensor& gate_up, Tensor& out) {
  return SwiGluFusedCuda(gate_up, out, exec_);
}

absl::Status CudaForwardOps::GatherRows(const Tensor& x,
                                        absl::Span<const int32_t> rows,
                                        Tensor& out) {
  return GatherRowsCuda(x, rows, out, exec_);
}

absl::Status CudaForwardOps::ScatterAddRows(const Tensor& y,
                                            absl::Span<const int32_t> rows,
                                            absl::Span<const float> weights,
                                            Tensor& out) {
  return ScatterAddRowsCuda(y, rows, weights, out, exec_);
}

absl::Status CudaForwardOps::Zero(Tensor& x) {
  if (x.memory() != MemoryType::kDevice) {
    return absl::InvalidArgumentError(
        absl::StrCat("Zero: ", x.DebugString(), " is not in device memory"));
  }
  RETURN_IF_CUDA_ERROR(cudaMemsetAsync(
      x.raw(), 0, x.bytes(), static_cast<cudaStream_t>(exec_.stream)));
  return absl::OkStatus();
}

// The embedding kernel gathers rows of x as if it were a table.
absl::Status CudaForwardOps::GatherLogitRows(const Tensor& x, Tensor& out) {
  return EmbeddingCuda(x, rows_, 0, out, exec_);
}

absl::StatusOr<Tensor> CudaForwardOps::ToHost(const Tensor& t) {
  if (t.memory() == MemoryType::kHost) return t;
  ASSIGN_OR_RETURN(Tensor host,
                   Tensor::HostUninitialized(t.dtype(), t.shape()));
  auto* s = static_cast<cudaStream_t>(exec_.stream);
  RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(host.raw(), t.raw(), t.bytes(),
                                       cudaMemcpyDeviceToHost, s));
  RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(s));
  return host;
}

}  // namespace shardlm
