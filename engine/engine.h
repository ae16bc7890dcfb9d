// Engine: a model, its KV cache and a block manager in one process, with a
// scheduler loop that batches sequences (continuous batching, chunked
// prefill). The cluster splits the same roles across ranks: the block
// manager and scheduling stay in the coordinator, the ModelRunner moves to
// the workers.
#ifndef SHARDLM_ENGINE_ENGINE_H_
#define SHARDLM_ENGINE_ENGINE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "backend/device.h"
#include "engine/block_manager.h"
#include "engine/drafter.h"
#include "engine/scheduler.h"
#include "engine/step_executor.h"
#include "kernels/precision.h"
#include "kernels/sampling/sampling.h"
#include "model/shard_plan.h"
#include "step/batch_limits.h"
#include "step/kv_cache.h"
#include "step/step.h"

namespace shardlm {

struct EngineOptions {
  KvCacheOptions kv;
  BatchLimits limits;
  int threads = 0;  // CPU threads; 0: DefaultCpuThreads().
  // Tensor and pipeline parallel degrees. tp * pp > 1 runs the shards on
  // threads of this process (the cluster runs them on worker ranks).
  int tp = 1;
  int pp = 1;
  // Context parallel degree (CPU only): each stage's ranks form TP x CP,
  // a sequence's KV blocks spread over the CP ranks (ExecutorOptions::cp).
  int cp = 1;
  // How a TP group splits a mixture of experts (ShardPlan).
  MoeSharding moe_sharding = MoeSharding::kAuto;
  // What PP's stage boundaries balance (PlanShards).
  PpBalance pp_balance = PpBalance::kDecode;
  // Where the model runs (rank r of tp * pp on GPU r on CUDA).
  DeviceKind device = DeviceKind::kCpu;
  int device_ordinal = 0;
  bool allow_shared_gpu = false;  // Tests: TP x PP ranks on one GPU.
  // --cuda-weights: how GPUs hold GGUF matrices (backend/device.h).
  CudaWeights cuda_weights = CudaWeights::kBf16;
  // Speculative decoding (--speculative): off by default. On, it makes
  // the kernels batch-invariant (kernels/batch_invariance.h), so that the
  // tokens are those of a run without it.
  SpeculationOptions speculation;
  // --batch-invariant: a row's result does not depend on the other rows
  // of its step (prefill then costs more); implied by speculation. CPU.
  bool batch_invariant = false;
  // --precision (kernels/precision.h): kExact (f32 activations) by
  // default; kFast quantizes matrix inputs to int8 (CPU only). One mode
  // per process: Create sets it for every rank here, and the cluster
  // sends it in the assignment.
  Precision precision = Precision::kExact;
  // A failed step pauses the engine and keeps its requests to be
  // recomputed once Resume() is called, instead of failing them: for an
  // executor that comes back (coordinator --rejoin). See Scheduler.
  bool resume_interrupted = false;

  // The KV and batch limits (KvCacheOptions, BatchLimits) and the degrees:
  // InvalidArgument naming the flag. Engine::Create and MakeExecutor
  // (executor/local_engine.h) call it.
  absl::Status Validate() const;
};

// Called with (request index, token) as each token is produced; returning
// false cancels that request.
using TokenCallback = std::function<bool(size_t, int32_t)>;

class Engine {
 public:
  // An engine over an executor: ranks in this process (CreateLocalEngine,
  // executor/local_engine.h) or remote workers (cluster/).
  static absl::StatusOr<std::unique_ptr<Engine>> Create(
      std::unique_ptr<StepExecutor> executor, const EngineOptions& options);

  const ModelConfig& config() const { return executor_->config(); }
  const BlockManager& blocks() const { return blocks_; }
  // The prefix cache's key insertions and evictions (for WatchState).
  const PrefixEventLog& prefix_events() const { return prefix_events_; }
  const StepExecutor& executor() const { return *executor_; }
  Precision precision() const { return options_.precision; }

  // Queues a request for the scheduler loop, which batches it with every
  // other running request; thread-safe. InvalidArgument as for
  // GenerateBatch ("request 0: ..."), ResourceExhausted when max_queued
  // requests already wait. See RequestCallbacks for how it reports back.
  absl::StatusOr<RequestId> Submit(GenerateRequest request,
                                   RequestCallbacks callbacks);
  // Submit for several requests that the loop takes in one intake
  // (Scheduler::SubmitGroup); each validated alone, each its own result.
  std::vector<absl::StatusOr<RequestId>> SubmitGroup(
      std::vector<Scheduler::GroupMember> members);
  // Ends a submitted request (kCancelled) within one step; thread-safe.
  void Cancel(RequestId id) { scheduler_->Cancel(id); }
  int64_t cancel_requests() const { return scheduler_->cancel_requests(); }
  // See Scheduler::DropKvState, Resume and EndAll.
  void DropKvState(absl::Status why) {
    scheduler_->DropKvState(std::move(why));
  }
  void Resume() { scheduler_->Resume(); }
  void EndAll(absl::Status why) { scheduler_->EndAll(std::move(why)); }
  bool paused() const { return scheduler_->paused(); }
  // Forward steps run so far.
  int64_t steps() const { return scheduler_->steps(); }
  int64_t waiting_requests() const { return scheduler_->waiting(); }
  // Queue, KV tier and preemption figures as of the last step;
  // thread-safe.
  SchedulerStats stats() const { return scheduler_->stats(); }
  // Latency histograms, request and token counters; thread-safe.
  const ServingMetrics& metrics() const { return scheduler_->metrics(); }

  // Runs the requests together until each finishes. Requests are checked
  // up front (InvalidArgument naming the request and field; nothing runs
  // then). A request whose prompt plus max_tokens can never fit in the KV
  // cache (device and host tiers together) is InvalidArgument with the
  // numbers. Every block is returned
  // before this returns, also on error (the first error ends the batch).
  // Thread-safe: concurrent batches share the scheduler's steps. on_token
  // runs on the scheduler's thread.
  absl::StatusOr<std::vector<GenerateResult>> GenerateBatch(
      const std::vector<GenerateRequest>& requests,
      const TokenCallback& on_token = nullptr);
  absl::StatusOr<GenerateResult> Generate(
      const GenerateRequest& request,
      const std::function<bool(int32_t)>& on_token = nullptr);

 private:
  Engine(std::unique_ptr<StepExecutor> executor, BlockManager blocks,
         EngineOptions options)
      : executor_(std::move(executor)),
        blocks_(WithEventLog(std::move(blocks), &prefix_events_)),
        options_(options),
        scheduler_(std::make_unique<Scheduler>(
            executor_.get(), &blocks_, options.limits,
            options.resume_interrupted, options.speculation)) {}
  static BlockManager WithEventLog(BlockManager blocks, PrefixEventLog* log) {
    blocks.set_event_log(log);
    return blocks;
  }
  absl::Status Validate(const std::vector<GenerateRequest>& requests) const;
  absl::Status ValidateOne(const GenerateRequest& request) const;

  std::unique_ptr<StepExecutor> executor_;
  PrefixEventLog prefix_events_;  // Before blocks_, which writes to it.
  BlockManager blocks_;
  EngineOptions options_;
  // Last: its loop uses the members above and is joined first.
  std::unique_ptr<Scheduler> scheduler_;
};

}  // namespace shardlm

#endif  // SHARDLM_ENGINE_ENGINE_H_
