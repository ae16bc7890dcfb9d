// A shard's weights on a GPU: uploaded from the host copy the loader
// made (dequantized and fused as the CUDA kernels want them), or random
// for benchmarks. Built only with CUDA.
#ifndef SHARDLM_WORKER_CUDA_WEIGHTS_H_
#define SHARDLM_WORKER_CUDA_WEIGHTS_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "backend/backend.h"
#include "kernels/cuda_ops.h"
#include "model/model_config.h"
#include "worker/llama_weights.h"

namespace shardlm {

// Uploads a shard's host weights to the device: matrices bf16 [out, in],
// Q/K/V fused into one (wqkv, with bqkv) and gate/up into another
// (w_gate_up), so that each is one GEMM; norms and biases f32; a tied LM
// head is the embedding's one copy.
absl::StatusOr<LlamaWeights> UploadLlamaWeights(const LlamaWeights& host,
                                                Backend& backend,
                                                const CudaExec& exec);

// Seeded uniform weights of `config` made on the device (benchmarks):
// matrices in [-1, 1) / sqrt(in), norms 1.
absl::StatusOr<LlamaWeights> RandomLlamaWeights(const ModelConfig& config,
                                                uint64_t seed, Backend& backend,
                                                const CudaExec& exec);

}  // namespace shardlm

#endif  // SHARDLM_WORKER_CUDA_WEIGHTS_H_
