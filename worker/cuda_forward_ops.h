// The forward pass's ops on a GPU (kernels/cuda_ops.h): the CUDA side of
// the ForwardOps seam (worker/forward.h), tested op by op against the same
// references as the CPU's in worker/forward_ops_test.cc (the GPU binary).
#ifndef SHARDLM_WORKER_CUDA_FORWARD_OPS_H_
#define SHARDLM_WORKER_CUDA_FORWARD_OPS_H_

#include "kernels/cuda_ops.h"
#include "worker/forward.h"

namespace shardlm {

// Bound to a stream (`exec`) and to the step's device-side token ids,
// logit rows and attention metadata (buffers that stay put while a CUDA
// graph replays); all must outlive the ops. GEMM inputs are bf16, the
// residual stream and GEMM outputs f32, weights bf16 or packed Q8_0 / Q4_0
// (--cuda-weights quantized; Linear dispatches on the weight's dtype),
// norms and biases f32, KV caches bf16 in the CUDA layout.
class CudaForwardOps : public ForwardOps {
 public:
  CudaForwardOps(const CudaExec& exec, const Tensor& ids, const Tensor& rows,
                 const CudaAttentionBatch& batch, const CudaRopeTable& rope,
                 Tensor& attention_workspace)
      : exec_(exec),
        ids_(ids),
        rows_(rows),
        batch_(batch),
        rope_(rope),
        attention_workspace_(attention_workspace) {}

  absl::Status Embed(const Tensor& table, int64_t vocab_begin,
                     Tensor& x) override;
  absl::Status RmsNorm(const Tensor& x, const Tensor& weight, float eps,
                       Tensor& out) override;
  absl::Status Linear(const Tensor& x, const Tensor& w, Tensor& y,
                      bool accumulate) override;
  // `rope` must be the table uploaded as the bound one (checked).
  absl::Status Rope(Tensor& x, const RopeTable& rope) override;
  absl::Status WriteKv(const Tensor& k, const Tensor& v,
                       const KvLayer& cache) override;
  absl::Status Attention(const Tensor& q, const KvLayer& cache,
                         const LayerAttention& layer, Tensor& out) override;
  absl::Status SwiGlu(const Tensor& gate, const Tensor& up,
                      Tensor& out) override;
  absl::Status Add(Tensor& x, const Tensor& y) override;
  absl::Status AddBias(Tensor& x, const Tensor& bias) override;
  absl::Status SplitQkv(const Tensor& qkv, Tensor& q, Tensor& k,
                        Tensor& v) override;
  // One kernel (QkvRopeWriteKvCuda): k and v are not written.
  absl::Status QkvRopeKv(const Tensor& qkv, const RopeTable& rope, Tensor& q,
                         Tensor& k, Tensor& v, const KvLayer& cache) override;
  absl::Status SwiGluFused(const Tensor& gate_up, Tensor& out) override;
  // Mixtures of experts; the rows come from the host's routing.
  absl::Status GatherRows(const Tensor& x, absl::Span<const int32_t> rows,
                          Tensor& out) override;
  absl::Status ScatterAddRows(const Tensor& y, absl::Span<const int32_t> rows,
                              absl::Span<const float> weights,
                              Tensor& out) override;
  absl::Status Zero(Tensor& x) override;
  absl::Status GatherLogitRows(const Tensor& x, Tensor& out) override;
  absl::StatusOr<Tensor> ToHost(const Tensor& t) override;
  // x += attn wo^T as the GEMM's beta = 1.
  bool fuses_residual() const override { return true; }

 private:
  const CudaExec& exec_;
  const Tensor& ids_;
  const Tensor& rows_;
  const CudaAttentionBatch& batch_;
  const CudaRopeTable& rope_;
  Tensor& attention_workspace_;
};

}  // namespace shardlm

#endif  // SHARDLM_WORKER_CUDA_FORWARD_OPS_H_
