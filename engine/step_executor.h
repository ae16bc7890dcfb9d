// StepExecutor: where the engine's forward steps run. The engine (block
// manager, scheduler, sampling) is the same whether the model runs in this
// process, on threads as a TP x PP cluster, or on remote worker ranks.
// Only the interface: the executors are in_process_executor.h,
// cuda_executor.h and remote_executor.h.
#ifndef SHARDLM_ENGINE_STEP_EXECUTOR_H_
#define SHARDLM_ENGINE_STEP_EXECUTOR_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "core/dtype.h"
#include "model/model_config.h"
#include "step/step.h"

namespace shardlm {

// K and V bytes of one token of context over every attending layer and KV
// head of the model (all ranks together, when no KV head is replicated).
int64_t KvBytesPerToken(const ModelConfig& config, DType dtype);

// One worker rank's figures for /metrics, as far as the executor knows
// them (remote workers report theirs in heartbeats).
struct RankReport {
  int rank = 0;  // 1 .. tp * pp.
  bool up = true;
  RunnerStats stats;
  std::optional<int64_t> resident_bytes;        // Its process's RSS.
  std::optional<int64_t> memory_limit_bytes;    // Its cgroup's limit.
  std::optional<double> heartbeat_age_seconds;  // Since its last message.
  int64_t weight_bytes = 0;                     // 0: not known.
  int64_t kv_bytes = 0, host_kv_bytes = 0;      // Its KV pool per tier.
  // Its GPU's memory in use (by every process) and in all, on CUDA.
  std::optional<int64_t> gpu_memory_used_bytes, gpu_memory_total_bytes;
};

class StepExecutor {
 public:
  virtual ~StepExecutor() = default;
  virtual const ModelConfig& config() const = 0;
  // KV blocks every rank can hold (the minimum over ranks): device tier,
  // and host (CPU offload) tier.
  virtual int64_t num_kv_blocks() const = 0;
  virtual int64_t num_host_kv_blocks() const { return 0; }
  // Element type of the KV cache (the same on every rank).
  virtual DType kv_cache_dtype() const = 0;
  // Where the model runs: "cpu" or "cuda".
  virtual const char* backend() const { return "cpu"; }
  // f32 weight bytes one step reads, summed over ranks.
  virtual int64_t weight_bytes() const = 0;
  // Runs one step on every rank; the last stage samples one token per
  // logit row (and returns the logits when step.return_logits).
  virtual absl::StatusOr<StepOutput> Forward(const StepInput& step) = 0;
  // Steps in flight (pipeline parallel overlap, issue #12): up to
  // max_steps_in_flight() steps may be submitted before the oldest is
  // collected; Collect returns their outputs in submission order. Steps in
  // flight hold disjoint sequences, and every rank runs them in submission
  // order. By default one step at a time: Submit runs Forward, Collect
  // hands its output back. Not concurrent with each other or Forward.
  virtual int max_steps_in_flight() const { return 1; }
  virtual absl::Status Submit(const StepInput& step);
  // FailedPrecondition when nothing is in flight.
  virtual absl::StatusOr<StepOutput> Collect();
  // The engine is done with sequence `seq_id`: executors that mirror block
  // tables (remote workers) drop theirs.
  virtual void Release(int64_t seq_id) {}
  // Per-rank time accounting where the executor can see it (in-process
  // runners), in rank order; empty otherwise.
  virtual std::vector<RunnerStats> RankStats() const { return {}; }
  // Per-rank figures for /metrics; by default RankStats() alone.
  virtual std::vector<RankReport> RankReports() const {
    std::vector<RankReport> out;
    for (const RunnerStats& s : RankStats()) {
      out.push_back({.rank = static_cast<int>(out.size()) + 1, .stats = s});
    }
    return out;
  }
  // OK while every rank is up; Unavailable naming a lost rank otherwise
  // (remote workers). Cheap: serving's readiness checks call it.
  virtual absl::Status Health() const { return absl::OkStatus(); }

 private:
  std::deque<absl::StatusOr<StepOutput>> submitted_;  // Default Submit's.
};

}  // namespace shardlm

#endif  // SHARDLM_ENGINE_STEP_EXECUTOR_H_
