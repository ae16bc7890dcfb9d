// Scheduler: the open-ended continuous-batching loop behind an Engine.
// Requests arrive at any time from any thread; one loop thread hands them
// to a BatchPlanner (admission, batching, preemption: see batch_planner.h),
// submits the steps it plans to the executor (up to the executor's
// max_steps_in_flight at once, each over disjoint sequences), applies each
// step's output and runs the requests' callbacks.
#ifndef SHARDLM_ENGINE_SCHEDULER_H_
#define SHARDLM_ENGINE_SCHEDULER_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "engine/batch_planner.h"
#include "engine/block_manager.h"
#include "engine/mask_worker.h"
#include "engine/request.h"
#include "engine/serving_metrics.h"
#include "engine/step_executor.h"

namespace shardlm {

// Thread-safe. `executor` and `blocks` are not owned, must outlive the
// scheduler and are used only by its loop thread once it is constructed
// (blocks() readers see a consistent state once a request's on_done ran).
class Scheduler {
 public:
  // With `resume_interrupted`, a failed step pauses the scheduler and puts
  // its sequences back in the queue to be recomputed
  // (BatchPlanner::Interrupt) until Resume() or EndAll(): for an executor
  // that comes back after a failure (coordinator --rejoin).
  // `speculation`: see BatchPlanner (its policy learns what rows cost
  // from the wall time of each decode-only step, with one step in flight).
  Scheduler(StepExecutor* executor, BlockManager* blocks, BatchLimits options,
            bool resume_interrupted = false,
            SpeculationOptions speculation = {});
  // Ends every request (Unavailable) and joins the loop.
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a request that the caller has validated (it fits the cache
  // alone). ResourceExhausted when max_queued requests already wait (unless
  // `ignore_queue_limit`); on_done is then never called.
  absl::StatusOr<RequestId> Submit(GenerateRequest request,
                                   RequestCallbacks callbacks,
                                   bool ignore_queue_limit = false);
  // Queues several requests in one intake, so the loop plans them from the
  // same state (the n sequences of one API request: in the same steps, in
  // order, their tokens do not depend on when each thread got here). Each
  // gets its id, or ResourceExhausted / Unavailable as from Submit.
  struct GroupMember {
    GenerateRequest request;
    RequestCallbacks callbacks;
  };
  std::vector<absl::StatusOr<RequestId>> SubmitGroup(
      std::vector<GroupMember> members);
  // The workers lost their KV caches (a cluster re-forming): fails every
  // request that holds blocks (running, swapped, preempted) with `why`
  // and empties the prefix cache, on the loop thread; returns once done.
  // Requests without blocks stay queued. With resume_interrupted, those
  // requests are interrupted instead (queued to be recomputed) and the
  // scheduler pauses until Resume() or EndAll().
  void DropKvState(absl::Status why);
  // The executor is back (the cluster re-formed): plans steps again.
  void Resume();
  // Ends every request with `why`, on the loop thread; returns once done
  // (the cluster could not re-form). Later submissions still run.
  void EndAll(absl::Status why);
  // Whether a failure paused the scheduler (see DropKvState).
  bool paused() const {
    absl::MutexLock lock(&mu_);
    return paused_;
  }
  // Ends the request (kCancelled) and frees its blocks within one step.
  // Unknown or finished ids are ignored.
  void Cancel(RequestId id);
  // Steps run so far (for tests and metrics).
  int64_t steps() const { return steps_.load(); }
  // Cancel() calls so far, taken or not yet (for tests: a held loop
  // publishes no stats).
  int64_t cancel_requests() const { return cancel_requests_.load(); }
  // Requests waiting for admission (for tests and metrics).
  int64_t waiting() const {
    absl::MutexLock lock(&mu_);
    return static_cast<int64_t>(intake_.size()) + planner_waiting_;
  }
  // Latency histograms and request counters (thread-safe).
  ServingMetrics& metrics() { return metrics_; }
  const ServingMetrics& metrics() const { return metrics_; }
  SchedulerStats stats() const {
    absl::MutexLock lock(&stats_mu_);
    return stats_;
  }

 private:
  void Loop();
  // Moves submissions and cancellations into the planner.
  void TakeIntake() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<RequestId> SubmitLocked(GenerateRequest request,
                                         RequestCallbacks callbacks,
                                         bool ignore_queue_limit)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether the loop has something to do besides running steps.
  bool HasNews() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || !intake_.empty() || !cancels_.empty() ||
           commands_done_ < commands_requested_;
  }
  // Runs a command on the loop thread and waits for it.
  enum class Command { kDropKv, kEndAll };
  void RunOnLoop(Command command, absl::Status why);
  void Pause(const absl::Status& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Publishes the stats, then runs the callbacks (no lock held).
  void RunEvents(std::vector<PlannerEvent>& events);
  // Collects and drops every step in flight (after a failure).
  void DrainInFlight();
  // Waits for the masks of the oldest step in flight (whose output is
  // collected) and counts them: its constraints are the planner's again.
  void FinishMasks();

  StepExecutor* executor_;  // Not owned.
  BlockManager* blocks_;    // Not owned.
  BatchLimits options_;
  std::atomic<int64_t> steps_{0};
  std::atomic<int64_t> cancel_requests_{0};
  ServingMetrics metrics_;
  BatchPlanner planner_;  // Loop thread only.
  // Computes the constrained rows' masks while their steps run; the masks
  // of the steps in flight, oldest first (null: none). Loop thread only.
  MaskWorker mask_worker_;
  std::deque<std::shared_ptr<LateMasks>> in_flight_masks_;
  // Per step in flight, oldest first: when it was submitted, and its token
  // rows when it only decodes (0 otherwise). Loop thread only.
  struct Submitted {
    std::chrono::steady_clock::time_point at;
    int64_t decode_rows = 0;
  };
  std::deque<Submitted> in_flight_times_;

  struct Submission {
    RequestId id;
    GenerateRequest request;
    RequestCallbacks callbacks;
    absl::Time submitted;
  };
  // Waiters wait on conditions over these (Mutex::Await), which the mutex
  // re-checks when it is released: no condition variable to notify.
  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  const bool resume_interrupted_;
  // Commands for the loop (DropKvState, EndAll), in order.
  uint64_t commands_requested_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t commands_done_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::pair<Command, absl::Status>> commands_ ABSL_GUARDED_BY(mu_);
  // A failure paused planning (resume_interrupted), since `paused_since_`.
  bool paused_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time paused_since_ ABSL_GUARDED_BY(mu_);
  RequestId next_id_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<Submission> intake_ ABSL_GUARDED_BY(mu_);
  std::vector<RequestId> cancels_ ABSL_GUARDED_BY(mu_);
  // The planner's queue as of its last change (for max_queued).
  int64_t planner_waiting_ ABSL_GUARDED_BY(mu_) = 0;
  mutable absl::Mutex stats_mu_;
  SchedulerStats stats_ ABSL_GUARDED_BY(stats_mu_);
  std::thread loop_;
};

}  // namespace shardlm

#endif  // SHARDLM_ENGINE_SCHEDULER_H_
