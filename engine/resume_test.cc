// Resuming after a failed step (issue #37): with resume_interrupted, the
// requests that held KV when a step failed are paused, recomputed from
// their tokens once the engine resumes, and end with the tokens (and
// finish reasons) of an undisturbed run.
#include <atomic>
#include <deque>
#include <memory>
#include <set>
#include <thread>
#include <vector>

#include "executor/scheduler_test_util.h"
#include "gmock/gmock.h"

namespace shardlm {
namespace {

// Runs steps at Collect, up to `depth` in flight (as a pipelined cluster),
// and fails the steps whose numbers (from 0, in submission order) are in
// `fail`, with every step still in flight behind a failed one: what a
// cluster that lost a rank does. Optionally fails every step holding
// `poison` (a request that kills its step each time).
class InterruptingExecutor : public StepExecutor {
 public:
  InterruptingExecutor(std::unique_ptr<StepExecutor> inner, int depth,
                       std::set<int64_t> fail, int64_t poison = -1)
      : inner_(std::move(inner)),
        depth_(depth),
        fail_(std::move(fail)),
        poison_(poison) {}
  const ModelConfig& config() const override { return inner_->config(); }
  int64_t num_kv_blocks() const override { return inner_->num_kv_blocks(); }
  int64_t num_host_kv_blocks() const override {
    return inner_->num_host_kv_blocks();
  }
  DType kv_cache_dtype() const override { return inner_->kv_cache_dtype(); }
  int64_t weight_bytes() const override { return inner_->weight_bytes(); }
  absl::StatusOr<StepOutput> Forward(const StepInput& step) override {
    return inner_->Forward(step);
  }
  int max_steps_in_flight() const override { return depth_; }
  absl::Status Submit(const StepInput& step) override {
    queue_.push_back({step, next_++});
    return absl::OkStatus();
  }
  absl::StatusOr<StepOutput> Collect() override {
    EXPECT_FALSE(queue_.empty());
    const StepInput step = std::move(queue_.front().first);
    const int64_t number = queue_.front().second;
    queue_.pop_front();
    const bool poisoned = std::find(step.seq_ids.begin(), step.seq_ids.end(),
                                    poison_) != step.seq_ids.end();
    failing_ |= fail_.contains(number) || poisoned;
    if (!failing_) return inner_->Forward(step);
    failing_ = !queue_.empty();
    ++failed_;
    return absl::UnavailableError("worker rank 3 was lost");
  }
  void Release(int64_t seq_id) override { inner_->Release(seq_id); }
  int64_t failed() const { return failed_.load(); }

 private:
  std::unique_ptr<StepExecutor> inner_;
  const int depth_;
  const std::set<int64_t> fail_;
  const int64_t poison_;
  std::deque<std::pair<StepInput, int64_t>> queue_;
  int64_t next_ = 0;
  bool failing_ = false;
  std::atomic<int64_t> failed_{0};
};

// Plays the coordinator's part while the test runs: whenever the engine
// pauses, the cluster "re-forms" (DropKvState, as Reform does) and the
// engine resumes.
class Reformer {
 public:
  explicit Reformer(Engine* engine)
      : thread_([this, engine] {
          while (!stop_.load()) {
            if (engine->paused()) {
              engine->DropKvState(absl::UnavailableError("re-forming"));
              std::this_thread::sleep_for(std::chrono::milliseconds(20));
              engine->Resume();
              ++resumes_;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(2));
          }
        }) {}
  ~Reformer() {
    stop_ = true;
    thread_.join();
  }
  int resumes() const { return resumes_.load(); }

 private:
  std::atomic<bool> stop_{false};
  std::atomic<int> resumes_{0};
  std::thread thread_;
};

class ResumeTest : public TinyEngineTest,
                   public ::testing::WithParamInterface<int> {
 protected:
  ResumeTest() : TinyEngineTest(2048, 5) {}

  Engine* MakeInterrupted(std::set<int64_t> fail, int64_t poison = -1,
                          EngineOptions options = {}) {
    auto inner = CreateInProcessExecutor(
        *source_, {.kv = options.kv, .threads_per_rank = 1});
    EXPECT_TRUE(inner.ok()) << inner.status();
    if (!inner.ok()) return nullptr;
    auto executor = std::make_unique<InterruptingExecutor>(
        std::move(*inner), GetParam(), std::move(fail), poison);
    executor_ = executor.get();
    options.threads = 1;
    options.resume_interrupted = true;
    return engines_.Keep(Engine::Create(std::move(executor), options));
  }
  InterruptingExecutor* executor_ = nullptr;
};

std::vector<GenerateRequest> Workload() {
  std::vector<GenerateRequest> reqs;
  for (int i = 0; i < 8; ++i) {
    GenerateRequest r{.prompt = Prompt(5 + i * 23, i), .max_tokens = 20 + i};
    if (i % 2 == 1) {
      r.sampling = {.temperature = 1.0f,
                    .top_p = 0.95f,
                    .seed = 100 + static_cast<uint64_t>(i)};
    }
    if (i == 3) r.sampling.frequency_penalty = 0.5f;
    r.logprobs = 3;
    reqs.push_back(std::move(r));
  }
  reqs[2].prompt = Prompt(700, 2);  // Prefilled in chunks when it fails.
  reqs[2].stop_token_ids = {17};
  return reqs;
}

// Steps fail mid-prefill (step 1: the long prompt's chunks are in flight)
// and mid-decode, twice: every request ends as it would have undisturbed.
TEST_P(ResumeTest, InterruptedRequestsEndAsIfUndisturbed) {
  const std::vector<GenerateRequest> reqs = Workload();
  Engine* plain = MakeEngine({.kv = {.prefix_caching = true}});
  Engine* engine = MakeInterrupted(
      {1, 9, 10, 25}, -1,
      {.kv = {.prefix_caching = true}, .limits = {.max_batched_tokens = 128}});
  ASSERT_NE(plain, nullptr);
  ASSERT_NE(engine, nullptr);
  Results want, got;
  std::vector<std::vector<int32_t>> streamed(reqs.size());
  {
    Reformer reformer(engine);
    for (size_t i = 0; i < reqs.size(); ++i) {
      ASSERT_TRUE(plain->Submit(reqs[i], want.Callbacks(i)).ok());
      ASSERT_TRUE(engine
                      ->Submit(reqs[i], got.Callbacks(i,
                                                      [&, i](int32_t t) {
                                                        streamed[i].push_back(
                                                            t);
                                                        return true;
                                                      }))
                      .ok());
    }
    want.Wait();
    got.Wait();
    EXPECT_GE(reformer.resumes(), 2);
  }
  EXPECT_GE(executor_->failed(), 3);
  const SchedulerStats s = engine->stats();
  EXPECT_GE(s.interruptions, 3);
  EXPECT_GT(s.resumed, 0);
  EXPECT_GT(s.recomputed_tokens, 0);
  for (size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_TRUE(want[i].ok()) << want[i].status();
    ASSERT_TRUE(got[i].ok()) << "request " << i << ": " << got[i].status();
    EXPECT_EQ(got[i]->tokens, want[i]->tokens) << "request " << i;
    // Each token reached the client once: none again after resuming.
    EXPECT_EQ(streamed[i], want[i]->tokens) << "request " << i;
    EXPECT_EQ(got[i]->finish_reason, want[i]->finish_reason);
    ASSERT_EQ(got[i]->logprobs.size(), want[i]->logprobs.size());
    for (size_t t = 0; t < want[i]->logprobs.size(); ++t) {
      // Recomputed KV comes from a prefill instead of decode steps: the
      // same math in another order.
      EXPECT_NEAR(got[i]->logprobs[t].sampled, want[i]->logprobs[t].sampled,
                  2e-3)
          << "request " << i << " token " << t;
    }
  }
  EXPECT_EQ(engine->blocks().used_blocks(), 0);
}

// Requests still queued when the step failed (max_seqs 2 of 8) wait out
// the pause and run after the resume, like the interrupted ones, each with
// its undisturbed tokens.
TEST_P(ResumeTest, QueuedRequestsAreServedAfterTheResume) {
  const std::vector<GenerateRequest> reqs = Workload();
  Engine* plain = MakeEngine({});
  Engine* engine = MakeInterrupted({4}, -1, {.limits = {.max_seqs = 2}});
  ASSERT_NE(plain, nullptr);
  ASSERT_NE(engine, nullptr);
  Results want, got;
  {
    Reformer reformer(engine);
    for (size_t i = 0; i < reqs.size(); ++i) {
      ASSERT_TRUE(plain->Submit(reqs[i], want.Callbacks(i)).ok());
      ASSERT_TRUE(engine->Submit(reqs[i], got.Callbacks(i)).ok());
    }
    want.Wait();
    got.Wait();
    EXPECT_EQ(reformer.resumes(), 1);
  }
  for (size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_TRUE(got[i].ok()) << "request " << i << ": " << got[i].status();
    EXPECT_EQ(got[i]->tokens, want[i]->tokens) << "request " << i;
  }
  // Only the (at most 2) running ones held KV; the queued ones just waited.
  EXPECT_GE(engine->stats().resumed, 1);
  EXPECT_LE(engine->stats().resumed, 2);
}

// A request whose step fails every time: after two failures it and its
// batch mates run alone, and it fails (with the failure's status) once two
// steps of its own failed; the others finish.
TEST_P(ResumeTest, ARequestThatKeepsFailingItsStepFails) {
  std::vector<GenerateRequest> reqs = Workload();
  reqs.resize(3);
  Engine* engine = MakeInterrupted({}, /*poison=*/1);
  ASSERT_NE(engine, nullptr);
  Results got;
  {
    Reformer reformer(engine);
    for (size_t i = 0; i < reqs.size(); ++i) {
      ASSERT_TRUE(engine->Submit(reqs[i], got.Callbacks(i)).ok());
    }
    got.Wait();
  }
  ASSERT_FALSE(got[1].ok());
  EXPECT_EQ(got[1].status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(got[1].status().message()),
              ::testing::HasSubstr("worker rank 3 was lost"));
  EXPECT_THAT(std::string(got[1].status().message()),
              ::testing::HasSubstr("2 steps of this request alone failed"));
  EXPECT_TRUE(got[0].ok()) << got[0].status();
  EXPECT_TRUE(got[2].ok()) << got[2].status();
  EXPECT_EQ(engine->blocks().used_blocks(), 0);
}

// The cluster never comes back: EndAll fails every paused request with
// its status, frees everything, and the engine serves new requests.
TEST_P(ResumeTest, EndAllFailsThePausedRequests) {
  std::vector<GenerateRequest> reqs = Workload();
  Engine* engine = MakeInterrupted({3});
  ASSERT_NE(engine, nullptr);
  Results got;
  for (size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_TRUE(engine->Submit(reqs[i], got.Callbacks(i)).ok());
  }
  const auto deadline = absl::Now() + absl::Seconds(60);
  while (!engine->paused() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_TRUE(engine->paused());
  // Paused: no step runs, whatever waits.
  const int64_t steps = engine->steps();
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_EQ(engine->steps(), steps);
  engine->EndAll(absl::UnavailableError("rank 3 did not come back"));
  got.Wait();
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(got[i].status().code(), absl::StatusCode::kUnavailable) << i;
    EXPECT_EQ(got[i].status().message(), "rank 3 did not come back");
  }
  EXPECT_FALSE(engine->paused());
  EXPECT_EQ(engine->blocks().used_blocks(), 0);
  auto next = engine->Generate({.prompt = Prompt(5, 1), .max_tokens = 5});
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->tokens.size(), 5u);
}

// A request cancelled while paused ends at once (cancelled), not at the
// resume.
TEST_P(ResumeTest, ACancelWhilePausedEndsTheRequest) {
  Engine* engine = MakeInterrupted({2});
  ASSERT_NE(engine, nullptr);
  Results got;
  auto id = engine->Submit({.prompt = Prompt(9, 1), .max_tokens = 500},
                           got.Callbacks(0));
  ASSERT_TRUE(id.ok());
  const auto deadline = absl::Now() + absl::Seconds(60);
  while (!engine->paused() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_TRUE(engine->paused());
  engine->Cancel(*id);
  got.Wait();
  ASSERT_TRUE(got[0].ok()) << got[0].status();
  EXPECT_EQ(got[0]->finish_reason, FinishReason::kCancelled);
  EXPECT_TRUE(engine->paused());
  engine->Resume();
}

// A request given the first k tokens of another run (resume_token_ids)
// generates the rest of that run: max_tokens, the draw index and the
// penalties count the resumed tokens.
TEST_P(ResumeTest, AResumedRequestGeneratesTheRestOfTheRun) {
  Engine* engine = MakeEngine({}, GetParam());
  ASSERT_NE(engine, nullptr);
  for (const GenerateRequest& base : Workload()) {
    auto full = engine->Generate(base);
    ASSERT_TRUE(full.ok()) << full.status();
    const size_t n = full->tokens.size();
    for (size_t k : {size_t{1}, n / 2, n - 1}) {
      GenerateRequest resumed = base;
      resumed.resumed.assign(full->tokens.begin(), full->tokens.begin() + k);
      auto rest = engine->Generate(resumed);
      ASSERT_TRUE(rest.ok()) << rest.status();
      EXPECT_EQ(rest->tokens, std::vector<int32_t>(full->tokens.begin() + k,
                                                   full->tokens.end()))
          << "resumed after " << k << " of " << n;
      EXPECT_EQ(rest->finish_reason, full->finish_reason);
    }
  }
  GenerateRequest bad = Workload()[0];
  bad.resumed.assign(bad.max_tokens, 1);
  EXPECT_EQ(engine->Generate(bad).status().code(),
            absl::StatusCode::kInvalidArgument);
  bad.resumed = {1, 301};
  EXPECT_EQ(engine->Generate(bad).status().code(),
            absl::StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(StepsInFlight, ResumeTest, ::testing::Values(1, 2));

}  // namespace
}  // namespace shardlm
