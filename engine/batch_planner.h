// BatchPlanner: the scheduler's decisions, with no threads, locks, clock or
// model. It holds the waiting queue and the running sequences, and splits
// each iteration as vLLM's schedule() / update_from_output() do:
//   Admit  takes cancellations, expired deadlines and admissions;
//   Plan   decides one step (token budget, chunking, block growth,
//          preemption) and returns it as a value for an executor;
//   Apply  takes the oldest planned step's output (tokens, stop tokens,
//          finishes, the prefix cache).
// The Scheduler runs it on its loop thread against a StepExecutor and the
// wall clock; `shardlm simulate` runs it on a virtual clock against a cost
// model; planner tests run it on synthetic states.
//
// KV blocks are taken as sequences grow. When the device runs short, the
// lowest-priority, latest running sequences are preempted: their blocks are
// swapped to the host tier (or, when the host is full, dropped and later
// recomputed; sampling draws depend only on (seed, token index), so the
// tokens do not change) and they wait at the head of their priority class.
// A sequence alone that outgrows the device moves its own oldest blocks to
// the host and reads them there. With prefix caching, a new sequence starts
// from the cached full blocks of its longest known prefix.
#ifndef SHARDLM_ENGINE_BATCH_PLANNER_H_
#define SHARDLM_ENGINE_BATCH_PLANNER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/block_manager.h"
#include "engine/drafter.h"
#include "engine/request.h"
#include "engine/serving_metrics.h"
#include "engine/speculation_policy.h"
#include "step/batch_limits.h"
#include "step/step.h"

namespace shardlm {

// Counters and a snapshot of the queues, for metrics and tests.
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
  // Resuming after a failure (BatchPlanner::Interrupt): the failures, the
  // sequences put back in the queue to be recomputed, and the tokens of
  // KV they lost.
  int64_t interruptions = 0;
  int64_t resumed = 0;
  int64_t recomputed_tokens = 0;
  // Steps failed by a KV block that failed its checksum (DataLoss): their
  // sequences were recomputed, no token came from them.
  int64_t kv_checksum_failures = 0;
  // Structured outputs: rows planned with a grammar mask, the time spent
  // computing those masks (on the scheduler's mask thread, while the steps
  // ran), and the part of it the steps waited for (not hidden).
  int64_t constrained_rows = 0;
  double mask_seconds = 0;
  double mask_wait_seconds = 0;
  // Token slots of the blocks sequences hold, and how many of them hold a
  // token's KV (a shared prefix block counts for each sequence holding
  // it); 1 - filled / allocated is the KV cache's internal fragmentation.
  int64_t kv_slots_allocated = 0;
  int64_t kv_slots_filled = 0;
  // Speculative decoding: verifications (a sequence's drafted tokens
  // checked in a step), the tokens drafted and those kept, and how many
  // verifications kept 0, 1, ... of their drafts.
  int64_t spec_verifications = 0;
  int64_t spec_drafted = 0;
  int64_t spec_accepted = 0;
  std::vector<int64_t> spec_kept_histogram;
  TierUsage device, host;
  // Under CP (more than one rank), each CP rank's share of each tier (its
  // block ids, BlockManager::RankOf); empty otherwise.
  std::vector<TierUsage> device_by_cp_rank, host_by_cp_rank;
  BlockCounters blocks;
};

// A constrained logit row of a plan: its mask is the constraint's
// Allowed() in the sequence's current state. The constraint stays the
// planner's; it may be read (only) until the plan's output is applied.
struct MaskRow {
  int32_t row = 0;
  TokenConstraint* constraint = nullptr;
};

// One planned step, as a value: what the executor runs, and whose it is.
struct StepPlan {
  StepInput step;
  std::vector<RequestId> rows;     // The request of each logit row.
  std::vector<RequestId> stepped;  // Every request with tokens in the step.
  // The constrained rows, whose masks step.history does not hold yet:
  // computed by ComputeMasks (mask_worker.h), in step.late_masks.
  std::vector<MaskRow> masks;
  // Every token of the step decodes (one per sequence, or a sequence's
  // last token and its drafts): its time measures what rows cost
  // (BatchPlanner::ObserveStep).
  bool decode_only = false;
};

// A request callback to run once no lock is held.
using PlannerEvent = std::function<void()>;

// Not thread-safe: one thread (the scheduler's loop) owns it.
class BatchPlanner {
 public:
  // `blocks` and `metrics` are not owned and must outlive the planner.
  // `release` is told each sequence whose KV an executor may drop (ended,
  // or preempted without a host copy); it may be empty.
  // With `speculation` enabled, decoding sequences verify drafted tokens
  // in their steps (several logit rows each); the tokens they keep are
  // exactly those sampled, so the output does not change (given batch-
  // invariant kernels: kernels/batch_invariance.h).
  BatchPlanner(BlockManager* blocks, ServingMetrics* metrics,
               BatchLimits options, int64_t vocab_size,
               std::function<void(RequestId)> release,
               SpeculationOptions speculation = {});
  ~BatchPlanner();
  BatchPlanner(const BatchPlanner&) = delete;
  BatchPlanner& operator=(const BatchPlanner&) = delete;

  // Queues a validated request (it fits the cache alone) by priority, then
  // id; ids must grow with arrival. `deadline` and `submitted` are on the
  // clock later passed as `now`.
  void Add(RequestId id, GenerateRequest request, RequestCallbacks callbacks,
           absl::Time submitted);
  // Ends the request (kCancelled) at the next Admit, or the first Admit
  // after its step in flight is applied. Unknown ids are forgotten then.
  void Cancel(RequestId id);

  // Ends cancelled and late requests, then admits waiting ones strictly in
  // order while the device has blocks for their next chunk (preempting
  // lower-priority running sequences to make room).
  void Admit(absl::Time now, std::vector<PlannerEvent>& events);
  // Plans a step over running sequences not in flight (at most `max_seqs`
  // of them): decode tokens first, then prefill chunks under
  // max_batched_tokens, growing block tables in priority order and
  // preempting later sequences when the device runs short. nullopt when
  // there is nothing to run. The plan is in flight until applied.
  std::optional<StepPlan> Plan(size_t max_seqs);
  // The next step of a pipeline that keeps up to `depth` steps in flight,
  // each taking its share of the busy sequences (all of them when depth is
  // 1), so that P stages can each hold a disjoint micro-batch; nullopt when
  // `depth` steps are in flight or there is nothing to run.
  std::optional<StepPlan> PlanForPipeline(int depth);
  // Applies the oldest step in flight: `out` is its output, or the error
  // that failed it (then every step in flight is abandoned and every holder
  // of KV fails with it, or, with resume_interrupted, is interrupted; a
  // DataLoss, a KV block that failed its checksum, always interrupts).
  // Runs on_token; on_done goes to events.
  void Apply(absl::StatusOr<StepOutput> out, absl::Time now,
             std::vector<PlannerEvent>& events);
  // Forgets every step in flight; their outputs will never be applied.
  void AbandonInFlight();
  // Ends every sequence that holds blocks with `why` and drops the prefix
  // cache (after a failed step or a cluster re-forming).
  void FailKvHolders(const absl::Status& why, absl::Time now,
                     std::vector<PlannerEvent>& events);
  // The KV of every sequence is lost (a rank died) but its tokens are not:
  // every running or swapped sequence goes back to the queue (at the head
  // of its priority class, as a preempted one) to be recomputed from its
  // prompt and the tokens generated so far, then decodes on; the prefix
  // cache is dropped. Sampling draws depend only on (seed, token index),
  // so the tokens that follow are those of an undisturbed run, and the
  // client sees only a pause. `suspects` are the failed step's sequences
  // (empty when the KV was lost between steps): one that was in
  // kIsolateAfterInterruptions failed steps is planned alone from then
  // on, and fails with `why` once kFailAfterFailuresAlone steps of its own
  // failed, so that a request that kills its step cannot re-form the
  // cluster forever, nor take the requests batched with it along. Nothing
  // may be in flight (AbandonInFlight first).
  void Interrupt(const absl::Status& why,
                 const std::vector<RequestId>& suspects, absl::Time now,
                 std::vector<PlannerEvent>& events);
  static constexpr int kIsolateAfterInterruptions = 2;
  static constexpr int kFailAfterFailuresAlone = 2;
  // A failed step interrupts its sequences (Interrupt) instead of failing
  // them: for an executor that comes back after a failure (coordinator
  // --rejoin), with the scheduler paused until it does.
  void set_resume_interrupted(bool on) { resume_interrupted_ = on; }
  // Ends cancelled requests and those past their deadline (Admit does it
  // first; a paused scheduler does only this).
  void EndCancelledAndLate(absl::Time now, std::vector<PlannerEvent>& events);
  // Ends every request with `why` (shutting down).
  void EndAll(const absl::Status& why, absl::Time now,
              std::vector<PlannerEvent>& events);

  // A decode-only step (StepPlan::decode_only) of `rows` token rows took
  // `seconds`: what the speculation policy weighs drafts against.
  void ObserveStep(int64_t rows, double seconds) {
    policy_.ObserveStep(rows, seconds);
  }

  size_t waiting() const { return waiting_.size(); }
  size_t running() const { return running_.size(); }
  size_t in_flight() const { return in_flight_.size(); }
  bool idle() const {
    return waiting_.empty() && running_.empty() && in_flight_.empty();
  }
  // Running sequences that are in flight or have tokens left to compute.
  size_t busy() const;
  // The counters, queue lengths and KV use (steps: those planned).
  SchedulerStats Stats() const;
  // Counts a plan's masks (StepPlan::masks) once computed: the time they
  // took, and the time the step waited for them.
  void CountMasks(double compute_seconds, double waited_seconds) {
    counters_.mask_seconds += compute_seconds;
    counters_.mask_wait_seconds += waited_seconds;
  }

 private:
  struct Sequence;

  void Enqueue(std::unique_ptr<Sequence> s);
  // What the row sampling token number `generated` of `s` needs for its
  // penalties and min_tokens (empty when it has neither; a constrained
  // row's mask comes apart, see StepPlan::masks).
  // Hybrid models with state snapshots: how many tokens of `s` a
  // prefill chunk stops at, so that the state there is kept for prefix
  // hits (BlockManager::SnapshotState); 0 when none.
  int64_t SnapshotAt(const Sequence& s) const;
  // `drafts`: tokens after the sequence's own that the row's sample
  // follows (a verification row), counted by its penalties.
  static SampleHistory History(const Sequence& s, int64_t generated,
                               absl::Span<const int32_t> drafts = {});
  // Drafted tokens per running sequence for the step being planned (0
  // for those that do not decode, or draft nothing), within `spare_rows`.
  std::vector<int> PlanDrafts(const std::vector<bool>& eligible,
                              int64_t spare_rows);
  // Keeps the drafts of a verification that its sampled tokens confirm:
  // the sequence's computed tokens end after the last kept one, its
  // blocks past them are freed. Returns the drafts kept.
  int KeepConfirmed(Sequence& s, const std::vector<int32_t>& drafts,
                    const int32_t* sampled);
  // Whether the head of the queue can start now, beside the `promised`
  // blocks of sequences started in this round (increased by its own first
  // chunk when it starts); swaps its blocks back in (or attaches its cached
  // prefix) when it can.
  bool TryStart(Sequence& s, int64_t& promised);
  // Takes device blocks so that running_[index] can compute `want` more
  // tokens, preempting later sequences not in this step and then moving its
  // own blocks to the host as needed; returns how many tokens it can
  // compute (0..want).
  int64_t Grow(size_t index, int64_t want, const std::vector<bool>& in_step);
  // Swaps `s` out (or drops its KV when the host cannot hold it).
  void Preempt(Sequence& s);
  // Drops the host blocks of waiting sequences, latest first, until
  // `blocks` are released (they are reusable from the next step).
  void RecomputeSwapped(int32_t blocks);
  void Drop(Sequence& s);  // Frees its blocks; recomputed from scratch.
  // Ends a sequence: frees its blocks, queues its on_done.
  void Finish(Sequence& s, absl::StatusOr<GenerateResult> result,
              absl::Time now, std::vector<PlannerEvent>& events);

  BlockManager* blocks_;     // Not owned.
  ServingMetrics* metrics_;  // Not owned.
  BatchLimits options_;
  int64_t vocab_size_;
  std::function<void(RequestId)> release_;

  std::deque<std::unique_ptr<Sequence>> waiting_;
  absl::flat_hash_set<RequestId> cancelled_;
  // Ordered by priority, then arrival.
  std::vector<std::unique_ptr<Sequence>> running_;
  // Planned and not yet applied, oldest first.
  struct InFlight {
    std::vector<Sequence*> rows;  // One per logit row.
    // Empty, or per logit row: whether it scores a prompt token (prompt
    // logprobs) rather than samples.
    std::vector<bool> scored;
    std::vector<Sequence*> stepped;  // Every sequence in the step.
    std::vector<int64_t> computed;   // Per stepped: its tokens computed.
    // Per stepped: the tokens it drafted, verified by its logit rows
    // [first_row[i], first_row[i] + drafts[i].size()] (empty: none).
    std::vector<std::vector<int32_t>> drafts;
    std::vector<size_t> first_row;
    int64_t tokens = 0;
    bool want_logprobs = false;
  };
  std::deque<InFlight> in_flight_;
  SchedulerStats counters_;
  bool resume_interrupted_ = false;
  SpeculationOptions speculation_;
  SpeculationPolicy policy_;
};

}  // namespace shardlm

#endif  // SHARDLM_ENGINE_BATCH_PLANNER_H_
