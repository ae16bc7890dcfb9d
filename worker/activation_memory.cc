#include "worker/activation_memory.h"

#include <algorithm>

#include "kernels/attention/paged_attention.h"
#include "kernels/linear/quant_device_pack.h"
#include "worker/cuda_graphs.h"

namespace shardlm {

RankActivationDims ActivationDimsOf(const ModelConfig& config,
                                    const ShardSpec& spec) {
  return {.hidden = config.hidden,
          .heads = spec.n_heads(),
          .kv_heads = spec.n_kv_heads(),
          .head_dim = config.head_dim,
          .ffn = spec.ffn_end - spec.ffn_begin,
          .experts = config.n_experts,
          .vocab_padded = spec.vocab_padded,
          .tp = spec.tp_size,
          .last_stage = spec.last_stage()};
}

std::vector<StepBufferPlan> GpuStepBuffers(const RankActivationDims& d) {
  const int64_t q_dim = d.heads * d.head_dim;
  const int64_t kv_dim = d.kv_heads * d.head_dim;
  std::vector<StepBufferPlan> plan = {
      {StepBuffer::kIds, DType::kI32, 1},
      {StepBuffer::kX, DType::kF32, d.hidden},
      {StepBuffer::kQ, DType::kF32, q_dim},
      {StepBuffer::kK, DType::kF32, kv_dim},
      {StepBuffer::kV, DType::kF32, kv_dim},
      {StepBuffer::kQkv, DType::kF32, q_dim + 2 * kv_dim},
      {StepBuffer::kXn, DType::kBF16, d.hidden},
      {StepBuffer::kAttn, DType::kBF16, q_dim},
  };
  if (d.experts > 0) {
    // The router's logits, then one expert's gathered rows at a time: its
    // input, gate and up outputs, SwiGLU (a GEMM input) and output.
    plan.push_back({StepBuffer::kRouterLogits, DType::kF32, d.experts});
    plan.push_back({StepBuffer::kMoeX, DType::kBF16, d.hidden});
    plan.push_back({StepBuffer::kMoeGate, DType::kF32, d.ffn});
    plan.push_back({StepBuffer::kMoeUp, DType::kF32, d.ffn});
    plan.push_back({StepBuffer::kMoeH, DType::kBF16, d.ffn});
    plan.push_back({StepBuffer::kMoeOut, DType::kF32, d.hidden});
  } else {
    plan.push_back({StepBuffer::kGateUp, DType::kF32, 2 * d.ffn});
    plan.push_back({StepBuffer::kH, DType::kBF16, d.ffn});
  }
  // TP partial sums are all-reduced before the residual add, which cannot
  // then be the GEMM's beta = 1; the experts' outputs are scattered into
  // them, weighted, before it.
  if (d.tp > 1 || d.experts > 0) {
    plan.push_back({StepBuffer::kPartial, DType::kF32, d.hidden});
  }
  plan.push_back({StepBuffer::kRows, DType::kI32, 1, /*per_row=*/true});
  plan.push_back({StepBuffer::kSampled, DType::kI32, 1, /*per_row=*/true});
  if (d.last_stage) {
    plan.push_back({StepBuffer::kLast, DType::kF32, d.hidden, true});
    plan.push_back({StepBuffer::kLastN, DType::kBF16, d.hidden, true});
    plan.push_back({StepBuffer::kLogits, DType::kF32, d.vocab_padded, true});
    if (d.tp > 1) {
      plan.push_back({StepBuffer::kGathered, DType::kF32, d.tp * d.vocab_padded,
                      true, /*flat=*/true});
    }
  }
  return plan;
}

int64_t GpuActivationBytes(const RankActivationDims& d, int64_t tokens,
                           int64_t rows) {
  // Decode steps run padded to their graph's batch size.
  rows = GraphPaddedRows(rows);
  tokens = std::max(tokens, rows);
  int64_t bytes = 0;
  for (const StepBufferPlan& b : GpuStepBuffers(d)) {
    bytes += BlockBytes(b.dtype) * b.width * (b.per_row ? rows : tokens);
  }
  const int64_t workspace = int64_t{sizeof(float)} *
                            CudaDecodeWorkspaceFloats(rows, d.heads, d.head_dim,
                                                      kMaxCudaDecodeSplits);
  return bytes + workspace;
}

int64_t LargestPackedMatrix(const LlamaWeights& w) {
  int64_t largest = 0;
  const auto see = [&](const Tensor& t) {
    if (!t.empty() && t.memory() == MemoryType::kDevice &&
        HasDeviceQuantLayout(t.dtype())) {
      largest = std::max(largest, t.numel());
    }
  };
  see(w.token_embd);
  see(w.lm_head);
  for (const LlamaLayerWeights& l : w.layers) {
    for (const Tensor* t :
         {&l.wqkv, &l.wo, &l.w_gate_up, &l.w_down, &l.wq, &l.wk, &l.wv,
          &l.w_gate, &l.w_up, &l.router, &l.exp_gate, &l.exp_up, &l.exp_down}) {
      see(*t);
    }
  }
  return largest;
}

int64_t GpuDequantScratchBytes(const LlamaWeights& w) {
  return DequantScratchBytes(LargestPackedMatrix(w));
}

}  // namespace shardlm
