// Scheduler: the open-ended continuous-batching loop behind an Engine.
// Requests arrive at any time from any thread; one loop thread admits them
// (by priority, then arrival) when their KV blocks can be reserved, builds
// one StepInput per iteration from every running sequence (decode tokens
// first, then prefill chunks under max_batched_tokens), runs it on the
// executor and hands each new token to its request.
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

 private:
  struct Sequence;
  using Event = std::function<void()>;

  void Loop();
  // Under mu_: takes cancellations, expired deadlines and admissions;
  // returns the callbacks to run once the lock is released.
  void Admit(std::vector<Event>& events);
  // Ends a running sequence: frees its blocks, queues its on_done.
  void Finish(Sequence& s, absl::StatusOr<GenerateResult> result,
              std::vector<Event>& events);
  // One forward step over the running sequences; a failed step ends them
  // all with its status.
  void Step();

  StepExecutor* executor_;  // Not owned.
  BlockManager* blocks_;    // Not owned.
  SchedulerOptions options_;
  std::atomic<int64_t> steps_{0};

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;                          // Guarded by mu_.
  RequestId next_id_ = 0;                          // Guarded by mu_.
  std::deque<std::unique_ptr<Sequence>> waiting_;  // Guarded by mu_.
  absl::flat_hash_set<RequestId> cancelled_;       // Guarded by mu_.
  // Loop thread only.
  std::vector<std::unique_ptr<Sequence>> running_;
  std::thread loop_;
};

}  // namespace shardlm

#endif  // SHARDLM_COORDINATOR_SCHEDULER_H_
