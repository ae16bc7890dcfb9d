#include "coordinator/scheduler.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"

namespace shardlm {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

void RunAll(std::vector<std::function<void()>>& events) {
  for (auto& e : events) e();
  events.clear();
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

// A request, waiting or running.
struct Scheduler::Sequence {
  RequestId id = 0;
  GenerateRequest request;
  RequestCallbacks callbacks;
  std::vector<int32_t> tokens;  // Prompt, then generated tokens.
  int64_t computed = 0;         // Tokens whose KV is in the cache.
  bool done = false;
  Clock::time_point submitted;
  Clock::time_point first_token;
  GenerateResult result;
};

Scheduler::Scheduler(StepExecutor* executor, BlockManager* blocks,
                     SchedulerOptions options)
    : executor_(executor), blocks_(blocks), options_(options) {
  loop_ = std::thread([this] { Loop(); });
}

Scheduler::~Scheduler() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  loop_.join();
}

absl::StatusOr<RequestId> Scheduler::Submit(GenerateRequest request,
                                            RequestCallbacks callbacks,
                                            bool ignore_queue_limit) {
  auto s = std::make_unique<Sequence>();
  s->tokens = request.prompt;
  s->request = std::move(request);
  s->callbacks = std::move(callbacks);
  s->submitted = Clock::now();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return absl::UnavailableError("the engine is shutting down");
    if (!ignore_queue_limit &&
        static_cast<int64_t>(waiting_.size()) >= options_.max_queued) {
      return absl::ResourceExhaustedError(
          absl::StrCat(waiting_.size(), " requests are already waiting (",
                       "max_queued); try again later"));
    }
    s->id = next_id_++;
    // Highest priority first; arrival order within a priority.
    const int32_t p = s->request.priority;
    auto at =
        std::find_if(waiting_.begin(), waiting_.end(),
                     [&](const auto& w) { return w->request.priority < p; });
    const RequestId id = s->id;
    waiting_.insert(at, std::move(s));
    cv_.notify_all();
    return id;
  }
}

void Scheduler::Cancel(RequestId id) {
  std::lock_guard<std::mutex> lock(mu_);
  cancelled_.insert(id);
  cv_.notify_all();
}

void Scheduler::Finish(Sequence& s, absl::StatusOr<GenerateResult> result,
                       std::vector<Event>& events) {
  s.done = true;
  blocks_->Free(s.id);
  executor_->Release(s.id);
  events.push_back(
      [cb = std::move(s.callbacks.on_done), r = std::move(result)]() mutable {
        if (cb) cb(std::move(r));
      });
}

void Scheduler::Admit(std::vector<Event>& events) {
  const absl::Time now = absl::Now();
  const auto cancelled_result = [](Sequence& s) {
    s.result.finish_reason = FinishReason::kCancelled;
    return std::move(s.result);
  };
  const auto late = [](const Sequence& s) {
    return absl::DeadlineExceededError(
        absl::StrCat("the deadline passed after ", s.result.tokens.size(),
                     " of ", s.request.max_tokens, " tokens"));
  };
  for (auto& s : running_) {
    if (cancelled_.contains(s->id)) {
      Finish(*s, cancelled_result(*s), events);
    } else if (s->request.deadline <= now) {
      Finish(*s, late(*s), events);
    }
  }
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    Sequence& s = **it;
    if (cancelled_.contains(s.id) || s.request.deadline <= now) {
      absl::StatusOr<GenerateResult> r = late(s);
      if (cancelled_.contains(s.id)) r = cancelled_result(s);
      events.push_back(
          [cb = std::move(s.callbacks.on_done), r = std::move(r)]() mutable {
            if (cb) cb(std::move(r));
          });
      it = waiting_.erase(it);
    } else {
      ++it;
    }
  }
  cancelled_.clear();
  std::erase_if(running_, [](const auto& s) { return s->done; });

  // A request enters once the blocks for its whole length (prompt +
  // max_tokens) are reserved, so running sequences never run out mid-way.
  // Strictly in order: a large request at the head is not starved by
  // smaller ones behind it. Each fits alone, so the head runs at the latest
  // when the cache is empty.
  while (!waiting_.empty() &&
         static_cast<int32_t>(running_.size()) < options_.max_seqs) {
    Sequence& s = *waiting_.front();
    const int64_t total =
        static_cast<int64_t>(s.request.prompt.size()) + s.request.max_tokens;
    if (!blocks_->Reserve(s.id, total).ok()) break;
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
  }
}

void Scheduler::Step() {
  std::vector<Event> events;
  // Decoding sequences first (one token each), then prefill chunks, up to
  // the step's token budget.
  StepInput step;
  std::vector<Sequence*> in_step;
  int64_t budget = options_.max_batched_tokens;
  for (int pass = 0; pass < 2; ++pass) {
    for (auto& sp : running_) {
      Sequence& s = *sp;
      if (budget == 0) break;
      const int64_t remaining =
          static_cast<int64_t>(s.tokens.size()) - s.computed;
      if (remaining == 0) continue;  // Scheduled in the first pass.
      const bool decoding = remaining == 1 && s.computed > 0;
      if (decoding != (pass == 0)) continue;
      const int64_t chunk = std::min(remaining, budget);
      budget -= chunk;
      const int32_t seq_index = static_cast<int32_t>(step.block_tables.size());
      step.block_tables.push_back(blocks_->Table(s.id));
      step.seq_ids.push_back(s.id);
      for (int64_t i = 0; i < chunk; ++i) {
        step.tokens.push_back(s.tokens[s.computed + i]);
        step.positions.push_back(static_cast<int32_t>(s.computed + i));
        step.token_seq.push_back(seq_index);
      }
      s.computed += chunk;
      // Logits only where a token is sampled: the end of the known tokens.
      if (s.computed == static_cast<int64_t>(s.tokens.size())) {
        const GenerateRequest& req = s.request;
        const uint64_t generated = s.tokens.size() - req.prompt.size();
        step.logit_rows.push_back(static_cast<int32_t>(step.tokens.size()) - 1);
        step.sampling.push_back(req.sampling);
        step.sample_index.push_back(generated);
        step.logprobs.push_back(req.logprobs);
        step.return_logits |= generated == 0 && req.return_prompt_logits;
        in_step.push_back(&s);
      }
    }
  }
  if (step.tokens.empty()) return;

  ++steps_;
  absl::StatusOr<StepOutput> out = executor_->Forward(step);
  if (out.ok() && out->tokens.size() != in_step.size()) {
    out = absl::InternalError(absl::StrCat("step returned ", out->tokens.size(),
                                           " tokens for ", in_step.size(),
                                           " rows"));
  }
  const bool want_logprobs =
      std::any_of(step.logprobs.begin(), step.logprobs.end(),
                  [](int32_t n) { return n > 0; });
  if (out.ok() && want_logprobs && out->logprobs.size() != in_step.size()) {
    out = absl::InternalError(
        absl::StrCat("step returned ", out->logprobs.size(),
                     " log-probability rows for ", in_step.size(), " rows"));
  }
  if (!out.ok()) {
    // The KV cache of every running sequence is now suspect: all fail.
    for (auto& s : running_) Finish(*s, out.status(), events);
    running_.clear();
    RunAll(events);
    return;
  }
  const int64_t vocab = executor_->config().vocab_size;
  for (size_t row = 0; row < in_step.size(); ++row) {
    Sequence& s = *in_step[row];
    const GenerateRequest& req = s.request;
    const int64_t generated =
        static_cast<int64_t>(s.tokens.size() - req.prompt.size());
    if (generated == 0 && req.return_prompt_logits) {
      const float* l = out->logits.f32().data() + row * vocab;
      s.result.prompt_logits.assign(l, l + vocab);
    }
    const int32_t token = out->tokens[row];
    s.tokens.push_back(token);
    s.result.tokens.push_back(token);
    const TokenLogprobs* logprobs = nullptr;
    if (req.logprobs > 0) {
      s.result.logprobs.push_back(std::move(out->logprobs[row]));
      logprobs = &s.result.logprobs.back();
    }
    const Clock::time_point now = Clock::now();
    if (generated == 0) {
      s.first_token = now;
      s.result.prefill_seconds = Seconds(s.submitted, now);
    }
    s.result.decode_seconds = Seconds(s.first_token, now);
    // The loop thread holds no lock here.
    const TokenAction action = s.callbacks.on_token
                                   ? s.callbacks.on_token(token, logprobs)
                                   : TokenAction::kContinue;
    if (action == TokenAction::kCancel) {
      s.result.finish_reason = FinishReason::kCancelled;
    } else if (action == TokenAction::kStop) {
      s.result.finish_reason = FinishReason::kStop;
    } else if (std::find(req.stop_token_ids.begin(), req.stop_token_ids.end(),
                         token) != req.stop_token_ids.end()) {
      s.result.finish_reason = FinishReason::kStop;
    } else if (generated + 1 >= req.max_tokens) {
      s.result.finish_reason = FinishReason::kLength;
    } else {
      continue;
    }
    Finish(s, std::move(s.result), events);
  }
  std::erase_if(running_, [](const auto& s) { return s->done; });
  RunAll(events);
}

void Scheduler::Loop() {
  std::vector<Event> events;
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] {
        return stopping_ || !waiting_.empty() || !running_.empty();
      });
      if (stopping_) break;
      Admit(events);
      // Requests wait only while others run (each fits the cache alone);
      // never spin should that ever not hold.
      if (running_.empty()) cv_.wait_for(lock, std::chrono::milliseconds(10));
    }
    RunAll(events);
    Step();
  }
  // Shutting down: nothing new is accepted (stopping_ is set).
  std::deque<std::unique_ptr<Sequence>> waiting;
  {
    std::lock_guard<std::mutex> lock(mu_);
    waiting.swap(waiting_);
  }
  const absl::Status gone = absl::UnavailableError("the engine shut down");
  for (auto& s : running_) Finish(*s, gone, events);
  running_.clear();
  for (auto& s : waiting) {
    if (s->callbacks.on_done) s->callbacks.on_done(gone);
  }
  RunAll(events);
}

}  // namespace shardlm
