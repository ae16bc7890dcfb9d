// A shard's weights on a GPU: uploaded from the host copy the loader
// made (dequantized and fused as the CUDA kernels want them), or random
// for benchmarks. Built only with CUDA.
#ifndef SHARDLM_WORKER_CUDA_WEIGHTS_H_
#define SHARDLM_WORKER_CUDA_WEIGHTS_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "backend/backend.h"
#include "backend/device.h"
#include "kernels/cuda_ops.h"
#include "model/model_config.h"
#include "worker/llama_weights.h"

namespace shardlm {

struct CudaUploadOptions {
  // --cuda-weights. kQuantized: the projections (wqkv, wo, w_gate_up,
  // w_down, an untied LM head) whose host copy is Q8_0 or Q4_0 stay in
  // their blocks, repacked into the device layout
  // (kernels/linear/quant_device_layout.h; a device tensor of that dtype
  // and shape, PackQuantized's bytes); a fused matrix only when its parts
  // share the format. The embedding, a mixture's router and experts (sliced
  // by rows per expert, which the packed layout does not allow) and every
  // other format stay bf16. The rank's dequantization scratch for steps of
  // more than 8 rows (DequantScratchBytes of the largest packed matrix,
  // at most 64 MiB) is reserved with exec's cuBLAS handle
  // (ReserveDequantScratchCuda), before KV sizing measures free memory.
  CudaWeights weights = CudaWeights::kBf16;
};

// Uploads a shard's host weights to the device: matrices bf16 [out, in]
// (or packed Q8_0 / Q4_0, above), Q/K/V fused into one (wqkv, with bqkv)
// and gate/up into another (w_gate_up), so that each is one GEMM; norms
// and biases f32; a tied LM head is the embedding's one copy.
absl::StatusOr<LlamaWeights> UploadLlamaWeights(
    const LlamaWeights& host, Backend& backend, const CudaExec& exec,
    const CudaUploadOptions& options = {});

// Seeded uniform weights of `config` made on the device (benchmarks):
// matrices in [-1, 1) / sqrt(in), norms 1. `matrices` Q8_0 or Q4_0: the
// projections and an untied LM head packed in that format instead
// (random codes, every block's scale 2^-8 * 1.03: values of no model, for
// timing only; the embedding stays bf16), with the dequantization scratch
// reserved as UploadLlamaWeights does.
absl::StatusOr<LlamaWeights> RandomLlamaWeights(const ModelConfig& config,
                                                uint64_t seed, Backend& backend,
                                                const CudaExec& exec,
                                                DType matrices = DType::kBF16);

}  // namespace shardlm

#endif  // SHARDLM_WORKER_CUDA_WEIGHTS_H_
