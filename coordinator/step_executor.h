// StepExecutor: where the engine's forward steps run. The engine (block
// manager, scheduler, sampling) is the same whether the model runs in this
// process, on threads as a TP x PP cluster, or on remote worker ranks.
#ifndef SHARDLM_COORDINATOR_STEP_EXECUTOR_H_
#define SHARDLM_COORDINATOR_STEP_EXECUTOR_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "core/tensor.h"
#include "model/model_config.h"
#include "model/weight_source.h"
#include "worker/model_runner.h"

namespace shardlm {

class StepExecutor {
 public:
  virtual ~StepExecutor() = default;
  virtual const ModelConfig& config() const = 0;
  // KV blocks every rank can hold (the minimum over ranks): device tier,
  // and host (CPU offload) tier.
  virtual int64_t num_kv_blocks() const = 0;
  virtual int64_t num_host_kv_blocks() const { return 0; }
  // f32 weight bytes one step reads, summed over ranks.
  virtual int64_t weight_bytes() const = 0;
  // Runs one step on every rank; the last stage samples one token per
  // logit row (and returns the logits when step.return_logits).
  virtual absl::StatusOr<StepOutput> Forward(const StepInput& step) = 0;
  // The engine is done with sequence `seq_id`: executors that mirror block
  // tables (remote workers) drop theirs.
  virtual void Release(int64_t seq_id) {}
  // Per-rank time accounting where the executor can see it (in-process
  // runners), in rank order; empty otherwise.
  virtual std::vector<RunnerStats> RankStats() const { return {}; }
  // OK while every rank is up; Unavailable naming a lost rank otherwise
  // (remote workers). Cheap: serving's readiness checks call it.
  virtual absl::Status Health() const { return absl::OkStatus(); }
};

struct ExecutorOptions {
  int tp = 1;
  int pp = 1;
  int32_t block_size = 16;
  // KV budget per rank; 0 sizes every rank for one full context.
  int64_t kv_cache_bytes = 0;
  // Host (CPU offload) KV tier per rank.
  int64_t cpu_offload_bytes = 0;
  // CPU threads each rank's kernels use (on whichever thread calls
  // Forward); 0 leaves the caller's OpenMP setting (one rank) or uses 1
  // (ranks on threads).
  int threads_per_rank = 0;
};

// One ModelRunner in this process when tp * pp == 1; otherwise tp * pp
// runners on threads, exchanging activations through in-process
// communicators, each loading only its shard.
absl::StatusOr<std::unique_ptr<StepExecutor>> CreateInProcessExecutor(
    const WeightSource& source, const ExecutorOptions& options);

}  // namespace shardlm

#endif  // SHARDLM_COORDINATOR_STEP_EXECUTOR_H_
