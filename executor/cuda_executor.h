// StepExecutors on GPUs, behind the same engine (scheduler, block manager,
// prefix cache, sampling parameters) as the CPU executors: the model in
// bf16 on one GPU, or tp x pp shards on threads of this process, one GPU
// each (or sharing GPUs, for tests), with a host KV tier in pinned memory
// when cpu_offload_bytes is set.
#ifndef SHARDLM_EXECUTOR_CUDA_EXECUTOR_H_
#define SHARDLM_EXECUTOR_CUDA_EXECUTOR_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "backend/device.h"
#include "executor/in_process_executor.h"
#include "model/weight_source.h"
#include "step/batch_limits.h"
#include "step/kv_cache.h"

namespace shardlm {

struct CudaExecutorOptions {
  // The KV cache (bf16; the host tier in pinned host memory; a zero
  // kv_cache_bytes sizes it by gpu_memory_utilization).
  KvCacheOptions kv;
  // The largest step (tokens) and the most sequences in one: activation
  // buffers are reserved for them before the KV pool is sized.
  BatchLimits limits;
  int device = 0;  // When tp * pp = 1; rank r takes device r % devices.
  int tp = 1;
  int pp = 1;
  PpBalance pp_balance = PpBalance::kDecode;  // PP's stage boundaries.
  // Ranks may share a GPU (their communicators stage through the host).
  bool allow_shared_gpu = false;
  // --cuda-weights: bf16, or Q8_0 / Q4_0 matrices kept quantized
  // (worker/cuda_weights.h).
  CudaWeights cuda_weights = CudaWeights::kBf16;
};

// Loads `source` onto GPU `options.device`. FailedPrecondition without a
// usable GPU (or in a binary built without CUDA), ResourceExhausted when
// the weights or not one KV block fit; the KV sizing is logged to stderr.
absl::StatusOr<std::unique_ptr<StepExecutor>> CreateCudaExecutor(
    const WeightSource& source, const CudaExecutorOptions& options);

}  // namespace shardlm

#endif  // SHARDLM_EXECUTOR_CUDA_EXECUTOR_H_
