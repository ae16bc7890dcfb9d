// Scheduler: the open-ended continuous-batching loop behind an Engine.
// Requests arrive at any time from any thread; one loop thread admits them
// (by priority, then arrival) when the device has blocks for their next
// chunk, builds one StepInput per iteration from every running sequence
// (decode tokens first, then prefill chunks under max_batched_tokens), runs
// it on the executor and hands each new token to its request.
//
// KV blocks are taken as sequences grow. When the device runs short, the
// lowest-priority, latest running sequences are preempted: their blocks are
// swapped to the host tier (or, when the host is full, dropped and later
// recomputed; sampling draws depend only on (seed, token index), so the
// tokens do not change) and they wait at the head of their priority class.
// A sequence alone that outgrows the device moves its own oldest blocks to
// the host and reads them there. With prefix caching, a new sequence starts
// from the cached full blocks of its longest known prefix.
#ifndef SHARDLM_COORDINATOR_SCHEDULER_H_
#define SHARDLM_COORDINATOR_SCHEDULER_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "coordinator/block_manager.h"
#include "coordinator/serving_metrics.h"
#include "coordinator/step_executor.h"
#include "kernels/sampling/sampling.h"

namespace shardlm {

struct GenerateRequest {
  std::vector<int32_t> prompt;  // Token ids; at least one.
  int32_t max_tokens = 16;
  SamplingParams sampling;
  std::vector<int32_t> stop_token_ids;  // Generation ends after one of these.
  bool return_prompt_logits = false;    // Logits at the last prompt position.
  // Per generated token: its log-probability and those of the `logprobs`
  // most likely tokens (0: none; at most kMaxLogprobs).
  int32_t logprobs = 0;
  // Waiting requests are admitted highest priority first, then in arrival
  // order.
  int32_t priority = 0;
  // A request not finished by then ends with DeadlineExceeded.
  absl::Time deadline = absl::InfiniteFuture();
  // Where it came from (a label of the request metrics).
  RequestApi api = RequestApi::kDirect;
};

enum class FinishReason { kLength, kStop, kCancelled };
const char* FinishReasonName(FinishReason r);

struct GenerateResult {
  std::vector<int32_t> tokens;  // Generated tokens (including a stop token).
  FinishReason finish_reason = FinishReason::kLength;
  std::vector<float> prompt_logits;  // When asked for: [vocab].
  double prefill_seconds = 0;        // From submission to the first token.
  double decode_seconds = 0;         // From the first to the last token.
  // When asked for (request.logprobs > 0): one per generated token.
  std::vector<TokenLogprobs> logprobs;
};

// What on_token wants done with its request after a token: go on, end it
// as finished (kStop, e.g. a stop string was seen) or as cancelled. Either
// end frees its blocks at once.
enum class TokenAction { kContinue, kStop, kCancel };

// How a submitted request reports back. Both run on the scheduler's loop
// thread (or, for on_done of a request never started, the thread that ends
// the scheduler), never under the scheduler's lock, so they may call
// Submit() and Cancel(). They should be quick: the whole batch waits.
struct RequestCallbacks {
  // Each generated token, in order, with its log-probabilities (null
  // unless the request asked for them; valid during the call only).
  std::function<TokenAction(int32_t token, const TokenLogprobs* logprobs)>
      on_token;
  // Exactly once, last: the result (finish_reason kCancelled when
  // cancelled, kStop when on_token said kStop), or the error that ended the
  // request (DeadlineExceeded, a failed step's status, Unavailable when the
  // scheduler shuts down).
  std::function<void(absl::StatusOr<GenerateResult>)> on_done;
};

using RequestId = int64_t;

struct SchedulerOptions {
  int32_t max_batched_tokens = 512;  // Most tokens in one step.
  int32_t max_seqs = 64;             // Most sequences running at once.
  int32_t max_queued = 256;          // Most requests waiting for admission.
};

// A snapshot for metrics and tests, taken after each loop iteration.
struct SchedulerStats {
  int64_t steps = 0;
  int64_t computed_tokens = 0;  // Tokens run through the model (prefill
                                // and decode; prefix hits are not).
  int64_t running = 0;
  int64_t waiting = 0;              // Including preempted sequences.
  int64_t steps_in_flight = 0;      // Submitted, output not yet applied.
  int64_t max_steps_in_flight = 0;  // The most at once so far.
  int64_t preempted_swap = 0;       // Preemptions that swapped to the host.
  int64_t preempted_recompute = 0;  // Preemptions that dropped the KV.
  int64_t offloaded = 0;  // Blocks a sequence moved to the host for itself.
  // Token slots of the blocks sequences hold, and how many of them hold a
  // token's KV (a shared prefix block counts for each sequence holding
  // it); 1 - filled / allocated is the KV cache's internal fragmentation.
  int64_t kv_slots_allocated = 0;
  int64_t kv_slots_filled = 0;
  TierUsage device, host;
  BlockCounters blocks;
};

// Thread-safe. `executor` and `blocks` are not owned, must outlive the
// scheduler and are used only by its loop thread once it is constructed
// (blocks() readers see a consistent state once a request's on_done ran).
class Scheduler {
 public:
  Scheduler(StepExecutor* executor, BlockManager* blocks,
            SchedulerOptions options);
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
  // The workers lost their KV caches (a cluster re-forming): fails every
  // request that holds blocks (running, swapped, preempted) with `why`
  // and empties the prefix cache, on the loop thread; returns once done.
  // Requests without blocks stay queued.
  void DropKvState(absl::Status why);
  // Ends the request (kCancelled) and frees its blocks within one step.
  // Unknown or finished ids are ignored.
  void Cancel(RequestId id);
  // Steps run so far (for tests and metrics).
  int64_t steps() const { return steps_.load(); }
  // Requests waiting for admission (for tests and metrics).
  int64_t waiting() const {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<int64_t>(waiting_.size());
  }
  // Latency histograms and request counters (thread-safe).
  ServingMetrics& metrics() { return metrics_; }
  const ServingMetrics& metrics() const { return metrics_; }
  SchedulerStats stats() const {
    std::lock_guard<std::mutex> lock(stats_mu_);
    return stats_;
  }

 private:
  struct Sequence;
  using Event = std::function<void()>;

  void Loop();
  // Under mu_: takes cancellations, expired deadlines and admissions;
  // returns the callbacks to run once the lock is released.
  void Admit(std::vector<Event>& events);
  // Under mu_: whether the head of the queue can start now, beside the
  // `promised` blocks of sequences started in this round (increased by its
  // own first chunk when it starts); swaps its blocks back in (or attaches
  // its cached prefix) when it can.
  bool TryStart(Sequence& s, int64_t& promised);
  // Under mu_: inserts by priority, then arrival.
  void Enqueue(std::unique_ptr<Sequence> s);
  // Takes device blocks so that running_[index] can compute `want` more
  // tokens, preempting later sequences not in this step and then moving
  // its own blocks to the host as needed; returns how many tokens it can
  // compute (0..want).
  int64_t Grow(size_t index, int64_t want, const std::vector<bool>& in_step);
  // Swaps `s` out (or drops its KV when the host cannot hold it).
  void Preempt(Sequence& s);
  // Drops the host blocks of waiting sequences, latest first, until
  // `blocks` are released (they are reusable from the next step).
  void RecomputeSwapped(int32_t blocks);
  void PublishStats();
  // Publishes the stats, then runs the callbacks (no lock held).
  void RunEvents(std::vector<Event>& events);
  // Finishes every sequence that holds blocks with `why`; drops the
  // prefix cache.
  void FailKvHolders(const absl::Status& why, std::vector<Event>& events);
  // Ends a running sequence: frees its blocks, queues its on_done.
  void Finish(Sequence& s, absl::StatusOr<GenerateResult> result,
              std::vector<Event>& events);
  // Plans a step over running sequences not in flight (at most
  // `max_seqs` of them) and submits it; false when there is nothing to
  // run. The planning (budgets, growth, preemption) is the synchronous
  // engine's; sequences in flight are neither planned nor preempted.
  bool SubmitStep(size_t max_seqs);
  // Collects the oldest step in flight and applies its output (tokens,
  // stops, finishes, prefix cache); a failed step ends every holder of KV.
  void CollectStep();
  // Collects and drops every step in flight (after a failure).
  void DrainInFlight();

  StepExecutor* executor_;  // Not owned.
  BlockManager* blocks_;    // Not owned.
  SchedulerOptions options_;
  std::atomic<int64_t> steps_{0};

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;                          // Guarded by mu_.
  uint64_t drops_requested_ = 0, drops_done_ = 0;  // Guarded by mu_.
  absl::Status drop_why_;                          // Guarded by mu_.
  RequestId next_id_ = 0;                          // Guarded by mu_.
  std::deque<std::unique_ptr<Sequence>> waiting_;  // Guarded by mu_.
  absl::flat_hash_set<RequestId> cancelled_;       // Guarded by mu_.
  // Loop thread only. Ordered by priority, then arrival.
  std::vector<std::unique_ptr<Sequence>> running_;
  // Steps submitted and not yet collected, oldest first (loop thread).
  struct InFlightStep {
    StepInput step;
    std::vector<Sequence*> in_step;  // One per logit row.
    std::vector<Sequence*> stepped;  // Every sequence in the step.
  };
  std::deque<InFlightStep> in_flight_;
  int64_t max_in_flight_ = 0;
  SchedulerStats counters_;  // Loop thread only; published to stats_.
  ServingMetrics metrics_;
  mutable std::mutex stats_mu_;
  SchedulerStats stats_;  // Guarded by stats_mu_.
  std::thread loop_;
};

}  // namespace shardlm

#endif  // SHARDLM_COORDINATOR_SCHEDULER_H_
