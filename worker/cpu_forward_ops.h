// The forward pass's ops on the CPU (kernels/<op>/<op>.h): the CPU side of
// the ForwardOps seam (worker/forward.h), tested op by op against a
// double-precision reference in worker/forward_ops_test.cc.
#ifndef SHARDLM_WORKER_CPU_FORWARD_OPS_H_
#define SHARDLM_WORKER_CPU_FORWARD_OPS_H_

#include <cstdint>

#include "kernels/attention/paged_attention.h"
#include "step/step.h"
#include "worker/forward.h"

namespace shardlm {

// Bound to one step's host-side tokens, positions and logit rows (`step`)
// and block tables (`batch`, whose window Attention sets per layer); both
// must outlive the ops. Tensors are host f32 (weights of any type Linear
// takes); both KV tiers are in the one allocation of each cache.
class CpuForwardOps : public ForwardOps {
 public:
  CpuForwardOps(const StepInput& step, AttentionBatch& batch, int64_t hidden)
      : step_(step), batch_(batch), hidden_(hidden) {}

  absl::Status Embed(const Tensor& table, int64_t vocab_begin,
                     Tensor& x) override;
  absl::Status RmsNorm(const Tensor& x, const Tensor& weight, float eps,
                       Tensor& out) override;
  absl::Status Linear(const Tensor& x, const Tensor& w, Tensor& y,
                      bool accumulate) override;
  absl::Status Rope(Tensor& x, const RopeTable& rope) override;
  absl::Status WriteKv(const Tensor& k, const Tensor& v,
                       const KvLayer& cache) override;
  absl::Status Attention(const Tensor& q, const KvLayer& cache,
                         const LayerAttention& layer, Tensor& out) override;
  absl::Status AttentionPartial(const Tensor& q, const KvLayer& cache,
                                const LayerAttention& layer, Tensor& out,
                                Tensor& lse) override;
  absl::Status MergeAttention(const Tensor& outs, const Tensor& lses,
                              const Tensor& sinks, Tensor& out) override;
  absl::Status SwiGluOai(const Tensor& gate, const Tensor& up,
                         Tensor& out) override;
  absl::Status HeadLinear(const Tensor& x, int64_t x_offset, const Tensor& w,
                          Tensor& y, int64_t y_offset) override;
  absl::Status CopyHeadColumns(const Tensor& x, int64_t x_offset, int64_t width,
                               Tensor& y, int64_t y_offset) override;
  absl::Status WriteLatent(const Tensor& first, const Tensor& second,
                           const KvLayer& cache) override;
  absl::Status LatentAttention(const Tensor& q, const KvLayer& cache,
                               float scale, int64_t window,
                               int64_t value_offset, Tensor& out) override;
  absl::Status SwiGlu(const Tensor& gate, const Tensor& up,
                      Tensor& out) override;
  absl::Status GeGlu(const Tensor& gate, const Tensor& up,
                     Tensor& out) override;
  absl::Status Add(Tensor& x, const Tensor& y) override;
  absl::Status Scale(Tensor& x, float factor) override;
  absl::Status SoftCap(Tensor& x, float cap) override;
  absl::Status AddBias(Tensor& x, const Tensor& bias) override;
  absl::StatusOr<Tensor> PadColumns(const Tensor& x, int64_t offset,
                                    int64_t width) override;
  absl::Status GatherRows(const Tensor& x, absl::Span<const int32_t> rows,
                          Tensor& out) override;
  absl::Status ScatterAddRows(const Tensor& y, absl::Span<const int32_t> rows,
                              absl::Span<const float> weights,
                              Tensor& out) override;
  absl::Status GatedDeltaNet(const Tensor& qk, const Tensor& v, const Tensor& z,
                             const Tensor& beta_in, const Tensor& alpha_in,
                             const DeltaNetLayer& layer, Tensor& out) override;
  absl::Status SigmoidGate(Tensor& x, const Tensor& gate) override;
  absl::Status Zero(Tensor& x) override;
  absl::Status GatherLogitRows(const Tensor& x, Tensor& out) override;
  absl::Status CompactRows(Tensor& x, int64_t slot,
                           absl::Span<const int64_t> counts) override;
  absl::StatusOr<Tensor> ToHost(const Tensor& t) override { return t; }
  // The CPU adds the residual separately (the numerics every CPU test and
  // reference was written against).
  bool fuses_residual() const override { return false; }

 private:
  const StepInput& step_;
  AttentionBatch& batch_;
  const int64_t hidden_;
  Tensor padded_;  // PadColumns' output, reused across layers.
  // GatedDeltaNet's scratch, reused across layers: the convolution's input
  // and output [n, channels], q and k [n, k_heads, k_dim], v and the delta
  // rule's output [n, heads, v_dim], g and beta [n, heads].
  Tensor mixed_, conv_, q_, k_, v_, o_, g_, beta_;
};

}  // namespace shardlm

#endif  // SHARDLM_WORKER_CPU_FORWARD_OPS_H_
