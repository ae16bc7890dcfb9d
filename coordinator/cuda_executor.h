// A StepExecutor on one GPU (TP = PP = 1): the whole model in bf16 on the
// device, behind the same engine (scheduler, block manager, prefix cache,
// sampling parameters) as the CPU executors. Multi-GPU TP x PP and the
// host KV tier on GPUs are not built yet (issue #9).
#ifndef SHARDLM_COORDINATOR_CUDA_EXECUTOR_H_
#define SHARDLM_COORDINATOR_CUDA_EXECUTOR_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "coordinator/step_executor.h"
#include "model/weight_source.h"

namespace shardlm {

struct CudaExecutorOptions {
  int device = 0;
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
