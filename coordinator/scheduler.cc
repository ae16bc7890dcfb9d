#include "coordinator/scheduler.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"

namespace shardlm {
namespace {

// The planner's clock: monotonic (latencies do not jump with the wall
// clock), as an absl::Time.
absl::Time MonotonicNow() {
  return absl::UnixEpoch() +
         absl::FromChrono(std::chrono::steady_clock::now().time_since_epoch());
}

}  // namespace

const char* FinishReasonName(FinishReason r) {
  switch (r) {
    case FinishReason::kLength:
      return "length";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kCancelled:
      return "cancelled";
  }
  return "?";
}

Scheduler::Scheduler(StepExecutor* executor, BlockManager* blocks,
                     BatchLimits options)
    : executor_(executor),
      blocks_(blocks),
      options_(options),
      planner_(blocks, &metrics_, options, executor->config().vocab_size,
               [executor](RequestId id) { executor->Release(id); }) {
  stats_ = planner_.Stats();
  loop_ = std::thread([this] { Loop(); });
}

Scheduler::~Scheduler() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  loop_.join();
}

absl::StatusOr<RequestId> Scheduler::Submit(GenerateRequest request,
                                            RequestCallbacks callbacks,
                                            bool ignore_queue_limit) {
  const absl::Time now = MonotonicNow();
  // Deadlines move to the planner's monotonic clock.
  if (request.deadline != absl::InfiniteFuture()) {
    request.deadline = now + (request.deadline - absl::Now());
  }
  absl::MutexLock lock(&mu_);
  if (stopping_) return absl::UnavailableError("the engine is shutting down");
  const int64_t queued =
      static_cast<int64_t>(intake_.size()) + planner_waiting_;
  if (!ignore_queue_limit && queued >= options_.max_queued) {
    metrics_.Refused(request.api, Refusal::kQueueFull);
    return absl::ResourceExhaustedError(
        absl::StrCat(queued, " requests are already waiting (",
                     "max_queued); try again later"));
  }
  const RequestId id = next_id_++;
  intake_.push_back({id, std::move(request), std::move(callbacks), now});
  return id;
}

void Scheduler::Cancel(RequestId id) {
  absl::MutexLock lock(&mu_);
  ++cancel_requests_;
  cancels_.push_back(id);
}

void Scheduler::TakeIntake() {
  for (Submission& s : intake_) {
    planner_.Add(s.id, std::move(s.request), std::move(s.callbacks),
                 s.submitted);
  }
  intake_.clear();
  for (RequestId id : cancels_) planner_.Cancel(id);
  cancels_.clear();
  // Counted at once: until the next step's events, Submit would otherwise
  // see neither the intake (now empty) nor the planner's grown queue.
  planner_waiting_ = static_cast<int64_t>(planner_.waiting());
}

void Scheduler::DrainInFlight() {
  for (int64_t n = planner_.in_flight(); n > 0; --n) (void)executor_->Collect();
  planner_.AbandonInFlight();
}

void Scheduler::RunEvents(std::vector<PlannerEvent>& events) {
  // Whoever a callback wakes sees the figures that include its request.
  SchedulerStats s = planner_.Stats();
  {
    absl::MutexLock lock(&mu_);
    planner_waiting_ = s.waiting;
    s.waiting += static_cast<int64_t>(intake_.size());
  }
  {
    absl::MutexLock lock(&stats_mu_);
    stats_ = s;
  }
  for (auto& e : events) e();
  events.clear();
}

void Scheduler::DropKvState(absl::Status why) {
  absl::MutexLock lock(&mu_);
  const uint64_t ticket = ++drops_requested_;
  drop_why_ = std::move(why);
  const auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return drops_done_ >= ticket || stopping_;
  };
  mu_.Await(absl::Condition(&done));
}

void Scheduler::Loop() {
  std::vector<PlannerEvent> events;
  while (true) {
    std::optional<absl::Status> drop;
    {
      absl::MutexLock lock(&mu_);
      const auto work = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return HasNews() || !planner_.idle();
      };
      mu_.Await(absl::Condition(&work));
      if (stopping_) break;
      TakeIntake();
      if (drops_done_ < drops_requested_) drop = drop_why_;
    }
    if (drop.has_value()) {
      DrainInFlight();
      planner_.FailKvHolders(*drop, MonotonicNow(), events);
      RunEvents(events);
      absl::MutexLock lock(&mu_);
      drops_done_ = drops_requested_;
      continue;
    }
    planner_.Admit(MonotonicNow(), events);
    RunEvents(events);
    if (planner_.running() == 0 && planner_.in_flight() == 0) {
      // Requests wait only while others run (each fits the cache alone);
      // never spin should that ever not hold.
      absl::MutexLock lock(&mu_);
      const auto news = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return HasNews();
      };
      mu_.AwaitWithTimeout(absl::Condition(&news), absl::Milliseconds(10));
      continue;
    }
    // Fill the pipeline: each step takes its share of the runnable
    // sequences, so that several (disjoint) steps can be in flight.
    const int depth = executor_->max_steps_in_flight();
    while (true) {
      std::optional<StepPlan> plan = planner_.PlanForPipeline(depth);
      if (!plan.has_value()) break;
      ++steps_;
      // A refused step comes back from Collect with its error.
      (void)executor_->Submit(plan->step);
    }
    {
      // Planning may have preempted sequences back into the queue; Submit
      // must count them during the step, not only after it.
      absl::MutexLock lock(&mu_);
      planner_waiting_ = static_cast<int64_t>(planner_.waiting());
    }
    if (planner_.in_flight() == 0) continue;
    absl::StatusOr<StepOutput> out = executor_->Collect();
    // After a failure the other steps in flight are collected and dropped
    // (the planner fails their sequences with this one's error).
    if (!out.ok()) {
      for (int64_t n = planner_.in_flight() - 1; n > 0; --n) {
        (void)executor_->Collect();
      }
    }
    planner_.Apply(std::move(out), MonotonicNow(), events);
    RunEvents(events);
  }
  DrainInFlight();
  // Shutting down: nothing new is accepted (stopping_ is set).
  {
    absl::MutexLock lock(&mu_);
    TakeIntake();
  }
  planner_.EndAll(absl::UnavailableError("the engine shut down"),
                  MonotonicNow(), events);
  RunEvents(events);
}

}  // namespace shardlm
