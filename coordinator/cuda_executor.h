// StepExecutors on GPUs, behind the same engine (scheduler, block manager,
// prefix cache, sampling parameters) as the CPU executors: the model in
// bf16 on one GPU, or tp x pp shards on threads of this process, one GPU
// each (or sharing GPUs, for tests). The host KV tier on GPUs is not built
// yet (issue #9).
#ifndef SHARDLM_COORDINATOR_CUDA_EXECUTOR_H_
#define SHARDLM_COORDINATOR_CUDA_EXECUTOR_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "coordinator/step_executor.h"
#include "model/weight_source.h"

namespace shardlm {

struct CudaExecutorOptions {
  int device = 0;  // When tp * pp = 1; rank r takes device r % devices.
  int tp = 1;
  int pp = 1;
  // Ranks may share a GPU (their communicators stage through the host).
  bool allow_shared_gpu = false;
  int32_t block_size = 16;
  // KV budget on the device; 0 sizes it by gpu_memory_utilization.
  int64_t kv_cache_bytes = 0;
  double gpu_memory_utilization = 0.90;
  // The largest step (tokens) and the most sequences in one: activation
  // buffers are reserved for them before the KV pool is sized.
  int32_t max_batched_tokens = 512;
  int32_t max_seqs = 64;
};

// Loads `source` onto GPU `options.device`. FailedPrecondition without a
// usable GPU (or in a binary built without CUDA), ResourceExhausted when
// the weights or not one KV block fit; the KV sizing is logged to stderr.
absl::StatusOr<std::unique_ptr<StepExecutor>> CreateCudaExecutor(
    const WeightSource& source, const CudaExecutorOptions& options);

}  // namespace shardlm

#endif  // SHARDLM_COORDINATOR_CUDA_EXECUTOR_H_
