#include "engine/scheduler.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "core/log.h"

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
                     BatchLimits options, bool resume_interrupted,
                     SpeculationOptions speculation)
    : executor_(executor),
      blocks_(blocks),
      options_(options),
      planner_(
          blocks, &metrics_, options, executor->config().vocab_size,
          [executor](RequestId id) { executor->Release(id); }, speculation),
      mask_worker_(executor->config().vocab_size),
      resume_interrupted_(resume_interrupted) {
  planner_.set_resume_interrupted(resume_interrupted);
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
  absl::MutexLock lock(&mu_);
  return SubmitLocked(std::move(request), std::move(callbacks),
                      ignore_queue_limit);
}

std::vector<absl::StatusOr<RequestId>> Scheduler::SubmitGroup(
    std::vector<GroupMember> members) {
  std::vector<absl::StatusOr<RequestId>> ids;
  absl::MutexLock lock(&mu_);
  for (GroupMember& m : members) {
    ids.push_back(SubmitLocked(std::move(m.request), std::move(m.callbacks),
                               /*ignore_queue_limit=*/false));
  }
  return ids;
}

absl::StatusOr<RequestId> Scheduler::SubmitLocked(GenerateRequest request,
                                                  RequestCallbacks callbacks,
                                                  bool ignore_queue_limit) {
  const absl::Time now = MonotonicNow();
  // Deadlines move to the planner's monotonic clock.
  if (request.deadline != absl::InfiniteFuture()) {
    request.deadline = now + (request.deadline - absl::Now());
  }
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
  for (int64_t n = planner_.in_flight(); n > 0; --n) {
    (void)executor_->Collect();
    FinishMasks();
  }
  planner_.AbandonInFlight();
}

void Scheduler::FinishMasks() {
  // Every collected step passes here once: its submission time too.
  if (!in_flight_times_.empty()) in_flight_times_.pop_front();
  SHARDLM_CHECK(!in_flight_masks_.empty(), "masks of no step in flight");
  const std::shared_ptr<LateMasks> masks = std::move(in_flight_masks_.front());
  in_flight_masks_.pop_front();
  if (masks == nullptr) return;
  // Done before the step's output is applied (its constraints then take
  // the sampled tokens), even where the step failed before sampling.
  masks->Wait();
  planner_.CountMasks(masks->compute_seconds(), masks->waited_seconds());
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
  RunOnLoop(Command::kDropKv, std::move(why));
}

void Scheduler::EndAll(absl::Status why) {
  RunOnLoop(Command::kEndAll, std::move(why));
}

void Scheduler::RunOnLoop(Command command, absl::Status why) {
  absl::MutexLock lock(&mu_);
  commands_.emplace_back(command, std::move(why));
  const uint64_t ticket = ++commands_requested_;
  const auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return commands_done_ >= ticket || stopping_;
  };
  mu_.Await(absl::Condition(&done));
}

void Scheduler::Pause(const absl::Status& why) {
  if (paused_) return;
  const int64_t waiting = planner_.waiting() + intake_.size();
  paused_ = true;
  paused_since_ = MonotonicNow();
  Log("the engine paused: %s; %d request(s) wait to resume (recomputed "
      "from their tokens) once the cluster is back",
      why.message(), waiting);
}

void Scheduler::Resume() {
  absl::MutexLock lock(&mu_);
  if (!paused_) return;
  paused_ = false;
  const double seconds = absl::ToDoubleSeconds(MonotonicNow() - paused_since_);
  metrics_.Paused(seconds);
  Log("the engine resumed after %.2f s; %d request(s) to recompute first",
      seconds, static_cast<int64_t>(planner_waiting_));
}

void Scheduler::Loop() {
  std::vector<PlannerEvent> events;
  while (true) {
    std::vector<std::pair<Command, absl::Status>> commands;
    bool paused;
    {
      absl::MutexLock lock(&mu_);
      const auto work = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return HasNews() || (!paused_ && !planner_.idle());
      };
      if (paused_) {
        // Cancellations and deadlines still end requests while paused.
        mu_.AwaitWithTimeout(absl::Condition(&work), absl::Milliseconds(100));
      } else {
        mu_.Await(absl::Condition(&work));
      }
      if (stopping_) break;
      TakeIntake();
      commands.swap(commands_);
      paused = paused_;
    }
    if (!commands.empty()) {
      DrainInFlight();
      for (auto& [command, why] : commands) {
        if (command == Command::kEndAll) {
          planner_.EndAll(why, MonotonicNow(), events);
          absl::MutexLock lock(&mu_);
          paused_ = false;
        } else if (resume_interrupted_) {
          planner_.Interrupt(why, {}, MonotonicNow(), events);
          absl::MutexLock lock(&mu_);
          Pause(why);
        } else {
          planner_.FailKvHolders(why, MonotonicNow(), events);
        }
      }
      RunEvents(events);
      absl::MutexLock lock(&mu_);
      commands_done_ += commands.size();
      continue;
    }
    if (paused) {
      planner_.EndCancelledAndLate(MonotonicNow(), events);
      RunEvents(events);
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
      // Its masks are computed while it runs; the sampler waits for them.
      std::shared_ptr<LateMasks> masks =
          mask_worker_.Start(std::move(plan->masks));
      plan->step.late_masks = masks;
      in_flight_masks_.push_back(std::move(masks));
      in_flight_times_.push_back(
          {.at = std::chrono::steady_clock::now(),
           .decode_rows = plan->decode_only
                              ? static_cast<int64_t>(plan->step.tokens.size())
                              : 0});
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
    // What a decode step's rows cost, for the speculation policy: measured
    // only with one step in flight (with more, a step's wall time includes
    // waiting behind the others).
    if (out.ok() && depth == 1 && !in_flight_times_.empty() &&
        in_flight_times_.front().decode_rows > 0) {
      planner_.ObserveStep(
          in_flight_times_.front().decode_rows,
          std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                        in_flight_times_.front().at)
              .count());
    }
    FinishMasks();
    // After a failure the other steps in flight are collected and dropped
    // (the planner fails, or interrupts, their sequences with this one's
    // error).
    const absl::Status failed = out.status();
    if (!failed.ok()) {
      for (int64_t n = planner_.in_flight() - 1; n > 0; --n) {
        (void)executor_->Collect();
        FinishMasks();
      }
    }
    planner_.Apply(std::move(out), MonotonicNow(), events);
    if (absl::IsDataLoss(failed)) {
      Log("a step failed a KV checksum: %s; %d request(s) recomputed from "
          "their tokens",
          failed.message(), static_cast<int64_t>(planner_.waiting()));
    } else if (!failed.ok() && resume_interrupted_) {
      absl::MutexLock lock(&mu_);
      planner_waiting_ = static_cast<int64_t>(planner_.waiting());
      Pause(failed);
    }
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
