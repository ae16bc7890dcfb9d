// The device memory a GPU rank holds beside its weights and KV blocks: the
// activation buffers of a step (CudaModelRunner::ReserveActivations) and the
// decode attention's split-K workspace. Serving reserves them before it
// sizes the KV pool from what is left; `shardlm simulate` subtracts the
// same figure from a GPU's KV budget. Plain arithmetic, no CUDA.
#ifndef SHARDLM_WORKER_ACTIVATION_MEMORY_H_
#define SHARDLM_WORKER_ACTIVATION_MEMORY_H_

#include <cstdint>
#include <vector>

#include "core/dtype.h"
#include "model/model_config.h"
#include "model/shard_plan.h"
#include "worker/llama_weights.h"

namespace shardlm {

// What one rank's activation buffers depend on.
struct RankActivationDims {
  int64_t hidden = 0;
  int64_t heads = 0;     // Query heads this rank holds.
  int64_t kv_heads = 0;  // KV heads this rank holds.
  int64_t head_dim = 0;
  int64_t ffn = 0;           // FFN columns this rank holds (of each expert).
  int64_t experts = 0;       // A mixture's experts (the router's width), or 0.
  int64_t vocab_padded = 0;  // Vocabulary rows of the rank's LM head slice.
  int64_t tp = 1;
  bool last_stage = true;  // Holds the LM head.
};

RankActivationDims ActivationDimsOf(const ModelConfig& config,
                                    const ShardSpec& spec);

// The device buffers of a GPU rank's steps, in the order
// CudaModelRunner::Reserve allocates them (it allocates from this list, so
// that what serving counts is what the runner holds): each `width` values
// of `dtype` per token of a step, or per logit row (`per_row`), as a
// [count, width] tensor ([count] when width is 1, flat [count * width]
// when `flat`).
enum class StepBuffer : uint8_t {
  kIds,  // Token ids.
  kX,    // The residual stream.
  kQ,
  kK,
  kV,
  kQkv,     // The fused QKV projection's output.
  kGateUp,  // The fused gate/up projection's output.
  kXn,      // GEMM inputs, bf16: normed x, attention output, SwiGLU.
  kAttn,
  kH,
  kPartial,   // TP partial sums (tp > 1).
  kRows,      // Logit row indices.
  kSampled,   // Sampled ids.
  kLast,      // The logit rows' hidden states, f32 and normed bf16
  kLastN,     // (last stage).
  kLogits,    // This rank's vocabulary slice of the logits (last stage).
  kGathered,  // [tp, rows, vocab_padded] (last stage, tp > 1).
  // Mixtures of experts (ForwardBuffers::router_logits, moe_*), in place of
  // kGateUp and kH: one expert's rows at a time.
  kRouterLogits,
  kMoeX,
  kMoeGate,
  kMoeUp,
  kMoeH,
  kMoeOut,
};
struct StepBufferPlan {
  StepBuffer buffer;
  DType dtype;
  int64_t width;
  bool per_row = false;
  bool flat = false;
};
std::vector<StepBufferPlan> GpuStepBuffers(const RankActivationDims& dims);

// Device bytes of the buffers for steps of up to `tokens` tokens and `rows`
// sequences (logit rows; a decode step has one token per sequence), the
// decode workspace for `rows` tokens at the most splits included; `rows`
// counts as GraphPaddedRows(rows) (worker/cuda_graphs.h), since decode steps
// run padded to their CUDA graph's batch size. Pinned
// host buffers (the logits' staging) are not device memory and not counted.
int64_t GpuActivationBytes(const RankActivationDims& dims, int64_t tokens,
                           int64_t rows);

// Quantized weights on a GPU (--cuda-weights quantized, worker/cuda_weights.h).
// A packed Q8_0 / Q4_0 matrix is a device tensor of that dtype whose bytes()
// are its packed bytes (the GGUF bytes: the layout pads nothing), so
// LlamaWeights::bytes() and bytes_per_step() count them as they are. Beside
// them a rank holds one dequantization scratch (steps of more than 8 rows):
// the values of the largest device tensor in Q8_0 / Q4_0 (0 when none) ...
int64_t LargestPackedMatrix(const LlamaWeights& device_weights);
// ... and its bytes: DequantScratchBytes (kernels/linear/quant_device_pack.h)
// of that, bf16 for at most 32 Mi values.
int64_t GpuDequantScratchBytes(const LlamaWeights& device_weights);

}  // namespace shardlm

#endif  // SHARDLM_WORKER_ACTIVATION_MEMORY_H_
