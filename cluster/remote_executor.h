// RemoteExecutor: a StepExecutor whose ranks are remote workers driven
// over the control plane (cluster/control_service.h). The engine's
// block manager stays here; workers mirror block tables, receiving only
// the blocks added since the last plan (BlockTableDeltas).
#ifndef SHARDLM_CLUSTER_REMOTE_EXECUTOR_H_
#define SHARDLM_CLUSTER_REMOTE_EXECUTOR_H_

#include <algorithm>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cluster/control_service.h"
#include "engine/step_executor.h"
#include "step/step_codec.h"

namespace shardlm {

struct RemoteExecutorStats {
  int64_t steps = 0;
  int64_t blocks_sent = 0;  // Block ids in plan deltas, over all steps.
  int64_t plan_bytes = 0;   // Serialized StepPlan bytes sent to one worker.
};

class RemoteExecutor : public StepExecutor {
 public:
  // Waits (up to `timeout`) until every worker of `service` is ready, then
  // returns an executor over them. `config` is the model's (the
  // coordinator reads only its header); `weight_bytes` is reported by
  // weight_bytes(). On error (see ControlService::WaitUntilReady) the
  // workers that did connect are sent Shutdown. `service` must outlive
  // the executor.
  static absl::StatusOr<std::unique_ptr<RemoteExecutor>> WaitForWorkers(
      ControlService& service, const ModelConfig& config,
      absl::Duration timeout, int64_t weight_bytes = 0);

  const ModelConfig& config() const override { return config_; }
  // The CP group's (ClusterOptions::cp): each CP rank holds the fewest
  // blocks any worker reported, block id g on CP rank g % cp.
  int64_t num_kv_blocks() const override { return kv_blocks_ * cp(); }
  int64_t num_host_kv_blocks() const override { return host_kv_blocks_ * cp(); }
  DType kv_cache_dtype() const override {
    return service_.options().kv.DTypeOnCpu();
  }
  int64_t weight_bytes() const override { return weight_bytes_; }
  // Not concurrent with itself or Release (the engine loop calls both).
  // After any failure every later call returns Unavailable at once, naming
  // the rank that failed first.
  absl::StatusOr<StepOutput> Forward(const StepInput& step) override;
  // Steps in flight: Submit sends the plan and returns; Collect waits for
  // the oldest step's results. Workers run plans in the order sent, so a
  // stage starts the next step while later stages finish the one before.
  int max_steps_in_flight() const override { return max_steps_in_flight_; }
  void set_max_steps_in_flight(int n) { max_steps_in_flight_ = std::max(1, n); }
  absl::Status Submit(const StepInput& step) override;
  absl::StatusOr<StepOutput> Collect() override;
  void Release(int64_t seq_id) override;
  // Thread-safe.
  absl::Status Health() const override;
  std::vector<RankReport> RankReports() const override;
  const char* backend() const override {
    return service_.options().device == "cuda" ? "cuda" : "cpu";
  }
  // Re-forming after a lost rank (ControlService::Reform): BeginReform
  // fails every later step with `why` until EndReform, which checks that
  // the re-formed workers hold the block counts the engine was built for
  // (FailedPrecondition naming both otherwise); the next step forgets
  // every block table the old workers had.
  void BeginReform(absl::Status why);
  absl::Status EndReform();

  // Sends Shutdown to every worker (they exit cleanly).
  void Shutdown(const std::string& reason);

  RemoteExecutorStats stats() const;

 private:
  RemoteExecutor(ControlService& service, const ModelConfig& config,
                 int64_t kv_blocks, int64_t host_kv_blocks,
                 int64_t weight_bytes)
      : service_(service),
        config_(config),
        kv_blocks_(kv_blocks),
        host_kv_blocks_(host_kv_blocks),
        weight_bytes_(weight_bytes) {}

  int cp() const { return std::max(1, service_.options().cp); }

  ControlService& service_;
  const ModelConfig config_;
  // The fewest blocks of each tier any worker holds.
  const int64_t kv_blocks_;
  const int64_t host_kv_blocks_;
  const int64_t weight_bytes_;
  BlockTableDeltas deltas_;
  uint64_t next_step_id_ = 1;
  int max_steps_in_flight_ = 1;
  // Submitted, not yet collected (the engine loop's thread only).
  struct InFlight {
    uint64_t step_id = 0;
    size_t rows = 0;  // Logit rows: one sampled token each.
    bool return_logits = false;
    bool want_logprobs = false;
    absl::Status error;  // Refused at Submit: Collect returns it.
  };
  std::deque<InFlight> in_flight_;

  mutable absl::Mutex mu_;
  absl::Status failed_ ABSL_GUARDED_BY(mu_);     // First failure; sticky.
  bool reformed_ ABSL_GUARDED_BY(mu_) = false;   // EndReform since a step.
  bool reforming_ ABSL_GUARDED_BY(mu_) = false;  // BeginReform..EndReform.
  RemoteExecutorStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shardlm

#endif  // SHARDLM_CLUSTER_REMOTE_EXECUTOR_H_
