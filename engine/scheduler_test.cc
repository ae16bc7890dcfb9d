// The open-ended scheduler on a small random model: concurrent submissions
// are batched without changing anyone's tokens, and cancellation, queue
// limits, deadlines, priorities and failed steps end requests cleanly.
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

#include "engine/engine.h"
#include "executor/in_process_executor.h"
#include "executor/scheduler_test_util.h"
#include "gtest/gtest.h"
#include "model/in_memory_weights.h"

namespace shardlm {
namespace {

class SchedulerTest : public TinyEngineTest {
 protected:
  SchedulerTest() : TinyEngineTest(8192, 3) {}
};

// The same workloads with 1, 2 and 3 steps in flight.
class PipelinedSchedulerTest : public SchedulerTest,
                               public ::testing::WithParamInterface<int> {
 protected:
  Engine* MakeEngine(EngineOptions options) {
    return SchedulerTest::MakeEngine(options, GetParam());
  }
};

TEST_P(PipelinedSchedulerTest, ConcurrentRequestsGetTheirOwnTokens) {
  std::vector<GenerateRequest> reqs;
  for (int i = 0; i < 64; ++i) {
    reqs.push_back(
        {.prompt = Prompt(1 + (i * 97) % 300, i), .max_tokens = 3 + i % 7});
  }
  reqs[0].prompt = Prompt(4096, 0);  // Prefilled in chunks beside the rest.
  reqs[5].sampling = {.temperature = 0.9f, .top_p = 0.9f, .seed = 11};

  // The reference: each request alone, one step in flight, with no prefix
  // cache (so that no run reuses another's KV). The same for every
  // parameter (the model is seeded), so it is computed once: under ASan
  // the 64 requests alone take half a minute.
  static const auto* const alone_run = [&] {
    auto* run = new std::pair<std::vector<GenerateResult>, int64_t>();
    auto alone_engine =
        SchedulerTest::MakeEngine({.kv = {.prefix_caching = false}});
    for (const auto& r : reqs) {
      const int64_t before = alone_engine->steps();
      auto got = alone_engine->Generate(r);
      EXPECT_TRUE(got.ok()) << got.status();
      run->second += alone_engine->steps() - before;
      run->first.push_back(got.ok() ? *got : GenerateResult{});
    }
    return run;
  }();
  const std::vector<GenerateResult>& alone = alone_run->first;
  const int64_t alone_steps = alone_run->second;

  auto engine = MakeEngine({.kv = {.kv_cache_bytes = 600 * kBlockBytes},
                            .limits = {.max_batched_tokens = 256}});
  Results results;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (size_t i = t; i < reqs.size(); i += 4) {
        auto id = engine->Submit(reqs[i], results.Callbacks(i));
        EXPECT_TRUE(id.ok()) << id.status();
      }
    });
  }
  for (auto& t : threads) t.join();
  results.Wait();
  for (size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_TRUE(results[i].ok()) << i << ": " << results[i].status();
    EXPECT_EQ(results[i]->tokens, alone[i].tokens) << "request " << i;
  }
  EXPECT_EQ(engine->blocks().used_blocks(), 0);
  // Batched: far fewer steps (each of P steps in flight takes 1/P).
  EXPECT_LT(engine->steps(), alone_steps * GetParam() / 2);
  EXPECT_EQ(engine->stats().max_steps_in_flight, GetParam());
}

TEST_P(PipelinedSchedulerTest, StopFromOnTokenEndsWithStopAndFreesBlocks) {
  // f32 KV: batched and alone rows sum in other orders, which moves f32
  // logprobs by ulps but flips f16 roundings of K and V (1.1e-4 seen), and
  // the 1e-4 bound below is about each row keeping its own logprobs.
  auto engine = MakeEngine(
      {.kv = {.kv_cache_bytes = 40 * 2 * kBlockBytes, .dtype = DType::kF32}});
  // The reference: the same greedy requests run to max_tokens alone, on an
  // engine of their own with no prefix cache (no KV reused from elsewhere).
  auto reference =
      MakeEngine({.kv = {.dtype = DType::kF32, .prefix_caching = false}});
  std::vector<GenerateResult> free_run;
  for (int i = 0; i < 6; ++i) {
    auto got = reference->Generate({.prompt = Prompt(5 + 11 * i, i),
                                    .max_tokens = 12,
                                    .logprobs = i % 3 * 4});
    ASSERT_TRUE(got.ok()) << got.status();
    free_run.push_back(*got);
  }
  // Together, each told to stop after i + 1 tokens by its callback.
  Results results;
  for (int i = 0; i < 6; ++i) {
    auto seen = std::make_shared<int>(0);
    RequestCallbacks cb = results.Callbacks(i);
    cb.on_token = [seen, i](int32_t, const TokenLogprobs* lp) {
      EXPECT_EQ(lp != nullptr, i % 3 != 0) << "request " << i;
      return ++*seen == i + 1 ? TokenAction::kStop : TokenAction::kContinue;
    };
    ASSERT_TRUE(engine
                    ->Submit({.prompt = Prompt(5 + 11 * i, i),
                              .max_tokens = 12,
                              .logprobs = i % 3 * 4},
                             std::move(cb))
                    .ok());
  }
  results.Wait();
  for (int i = 0; i < 6; ++i) {
    ASSERT_TRUE(results[i].ok()) << results[i].status();
    const GenerateResult& got = *results[i];
    EXPECT_EQ(got.finish_reason, FinishReason::kStop) << i;
    const std::vector<int32_t> want(free_run[i].tokens.begin(),
                                    free_run[i].tokens.begin() + i + 1);
    EXPECT_EQ(got.tokens, want) << i;
    // Batched, each row keeps its own log-probabilities.
    ASSERT_EQ(got.logprobs.size(), i % 3 == 0 ? 0u : want.size()) << i;
    for (size_t t = 0; t < got.logprobs.size(); ++t) {
      const TokenLogprobs& a = got.logprobs[t];
      const TokenLogprobs& b = free_run[i].logprobs[t];
      EXPECT_NEAR(a.sampled, b.sampled, 1e-4);
      ASSERT_EQ(a.top.size(), static_cast<size_t>(i % 3 * 4));
      ASSERT_EQ(a.top.size(), b.top.size());
      for (size_t k = 0; k < a.top.size(); ++k) {
        EXPECT_NEAR(a.top[k].logprob, b.top[k].logprob, 1e-4);
      }
      EXPECT_EQ(a.top[0].token, got.tokens[t]);  // Greedy: the top-1.
    }
  }
  EXPECT_EQ(engine->blocks().used_blocks(), 0);
}

TEST_P(PipelinedSchedulerTest, CancellingAtRandomPointsLeaksNoBlock) {
  // A small device pool and host tier: cancellations also hit sequences
  // that are preempted and swapped out. Whether a swap happens before the
  // cancellations drain the pool depends on timing: the workload runs
  // again (on a fresh engine, other random points) until one did, at most
  // three times, and every run must end cleanly.
  int64_t swaps = 0;
  for (int attempt = 0; attempt < 3 && swaps == 0; ++attempt) {
    auto engine =
        MakeEngine({.kv = {.kv_cache_bytes = 30 * kBlockBytes,
                           .cpu_offload_bytes = 40 * kBlockBytes},
                    .limits = {.max_batched_tokens = 64, .max_seqs = 8}});
    Results results;
    std::mt19937 rng(7 + attempt);
    std::vector<RequestId> ids;
    for (int i = 0; i < 100; ++i) {
      const int stop_after = static_cast<int>(rng() % 30);
      std::function<bool(int32_t)> on_token;
      if (i % 2 == 0) {  // Half cancel from their token callback.
        auto seen = std::make_shared<int>(0);
        on_token = [seen, stop_after](int32_t) { return ++*seen < stop_after; };
      }
      auto id = engine->Submit(
          {.prompt = Prompt(1 + static_cast<int>(rng() % 100), i),
           .max_tokens = 25},
          results.Callbacks(i, on_token));
      ASSERT_TRUE(id.ok()) << id.status();
      ids.push_back(*id);
    }
    // The other half by Cancel(), waiting or running.
    for (size_t i = 1; i < ids.size(); i += 2) {
      std::this_thread::sleep_for(std::chrono::microseconds(rng() % 3000));
      engine->Cancel(ids[i]);
    }
    results.Wait();
    int cancelled = 0;
    for (size_t i = 0; i < ids.size(); ++i) {
      ASSERT_TRUE(results[i].ok()) << results[i].status();
      cancelled += results[i]->finish_reason == FinishReason::kCancelled;
    }
    EXPECT_GT(cancelled, 50);
    EXPECT_EQ(engine->blocks().used_blocks(), 0);
    swaps = engine->stats().preempted_swap;
  }
  EXPECT_GT(swaps, 0) << "no run swapped a sequence out";
}

TEST_F(SchedulerTest, QueueOverflowIsResourceExhausted) {
  auto engine = MakeEngine({.limits = {.max_seqs = 1, .max_queued = 2}});
  std::promise<void> running;
  std::atomic<bool> first{true};
  Results results;
  auto long_one = engine->Submit({.prompt = Prompt(4, 1), .max_tokens = 400},
                                 results.Callbacks(0, [&](int32_t) {
                                   if (first.exchange(false))
                                     running.set_value();
                                   return true;
                                 }));
  ASSERT_TRUE(long_one.ok()) << long_one.status();
  running.get_future().wait();
  for (int i = 1; i <= 2; ++i) {
    auto id = engine->Submit({.prompt = Prompt(4, i), .max_tokens = 4},
                             results.Callbacks(i));
    ASSERT_TRUE(id.ok()) << id.status();
  }
  auto over = engine->Submit({.prompt = Prompt(4, 3), .max_tokens = 4}, {});
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted)
      << over.status();
  engine->Cancel(*long_one);
  results.Wait();
  EXPECT_EQ(results[0]->finish_reason, FinishReason::kCancelled);
  EXPECT_EQ(results[2]->tokens.size(), 4u);
  EXPECT_EQ(engine->blocks().used_blocks(), 0);
}

TEST_P(PipelinedSchedulerTest, PassedDeadlinesAreDeadlineExceeded) {
  auto engine = MakeEngine({});
  auto past = engine->Generate({.prompt = Prompt(4, 1),
                                .max_tokens = 4,
                                .deadline = absl::Now() - absl::Seconds(1)});
  EXPECT_EQ(past.status().code(), absl::StatusCode::kDeadlineExceeded)
      << past.status();
  // Running when it passes: slow tokens outlast a short deadline.
  auto slow = engine->Generate(
      {.prompt = Prompt(4, 1),
       .max_tokens = 300,
       .deadline = absl::Now() + absl::Milliseconds(100)},
      [](int32_t) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
        return true;
      });
  EXPECT_EQ(slow.status().code(), absl::StatusCode::kDeadlineExceeded)
      << slow.status();
  EXPECT_EQ(engine->blocks().used_blocks(), 0);
  auto fine = engine->Generate({.prompt = Prompt(4, 1), .max_tokens = 4});
  EXPECT_TRUE(fine.ok()) << fine.status();
}

TEST_P(PipelinedSchedulerTest, HigherPriorityIsAdmittedFirst) {
  // 8 blocks; each request needs 7 (100 tokens): one at a time. The first
  // is already running when the others arrive; as the higher-priority ones
  // grow it is preempted, and it resumes in its own class's order.
  auto engine = MakeEngine({.kv = {.kv_cache_bytes = 8 * kBlockBytes}});
  ASSERT_EQ(engine->blocks().num_blocks(), 8);
  std::promise<void> submitted;
  std::shared_future<void> gate = submitted.get_future().share();
  Results results;
  const auto req = [](int32_t priority) {
    return GenerateRequest{
        .prompt = Prompt(60, 2), .max_tokens = 40, .priority = priority};
  };
  // The first request runs, and holds the loop on its first token until the
  // others wait behind it.
  std::promise<void> started;
  std::atomic<bool> first{true};
  ASSERT_TRUE(
      engine
          ->Submit(req(0), results.Callbacks(0,
                                             [&, gate](int32_t) {
                                               if (first.exchange(false)) {
                                                 started.set_value();
                                               }
                                               gate.wait();
                                               return true;
                                             }))
          .ok());
  started.get_future().wait();
  const int32_t priorities[] = {0, 5, 2, 5, -1};
  for (size_t i = 0; i < 5; ++i) {
    ASSERT_TRUE(
        engine->Submit(req(priorities[i]), results.Callbacks(i + 1)).ok());
  }
  submitted.set_value();
  results.Wait();
  EXPECT_EQ(results.order(), (std::vector<size_t>{2, 4, 3, 0, 1, 5}));
  for (size_t i = 1; i < 6; ++i) {
    ASSERT_TRUE(results[i].ok()) << results[i].status();
    EXPECT_EQ(results[i]->tokens, results[0]->tokens) << i;
  }
  EXPECT_GT(engine->stats().preempted_recompute, 0);
  EXPECT_EQ(engine->blocks().used_blocks(), 0);
}

// Fails the first step that carries `fail_at_seqs` sequences, as a lost
// worker would. No step runs before `go` is ready.
class FlakyExecutor : public StepExecutor {
 public:
  FlakyExecutor(std::unique_ptr<StepExecutor> inner, size_t fail_at_seqs,
                std::shared_future<void> go)
      : inner_(std::move(inner)),
        fail_at_seqs_(fail_at_seqs),
        go_(std::move(go)) {}
  const ModelConfig& config() const override { return inner_->config(); }
  int64_t num_kv_blocks() const override { return inner_->num_kv_blocks(); }
  DType kv_cache_dtype() const override { return inner_->kv_cache_dtype(); }
  int64_t weight_bytes() const override { return inner_->weight_bytes(); }
  absl::StatusOr<StepOutput> Forward(const StepInput& step) override {
    go_.wait();
    if (!failed_ && step.seq_ids.size() == fail_at_seqs_) {
      failed_ = true;
      return absl::UnavailableError("rank 1 was lost");
    }
    return inner_->Forward(step);
  }
  void Release(int64_t seq_id) override { inner_->Release(seq_id); }

 private:
  std::unique_ptr<StepExecutor> inner_;
  size_t fail_at_seqs_;
  std::shared_future<void> go_;
  bool failed_ = false;
};

TEST_F(SchedulerTest, AFailedStepFailsTheRunningRequestsOnly) {
  auto inner = CreateInProcessExecutor(*source_, {});
  ASSERT_TRUE(inner.ok()) << inner.status();
  // At most 3 run at once: the 4th request waits, and is not running
  // when the step of 3 fails. No step runs until all 4 are in (the first
  // could otherwise finish before the others come).
  std::promise<void> go;
  Engine* engine = engines_.Keep(
      Engine::Create(std::make_unique<FlakyExecutor>(std::move(*inner), 3,
                                                     go.get_future().share()),
                     {.limits = {.max_seqs = 3}}));
  ASSERT_NE(engine, nullptr);
  std::vector<GenerateRequest> reqs(
      4, {.prompt = Prompt(10, 4), .max_tokens = 50});
  Results results;
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_TRUE(engine->Submit(reqs[i], results.Callbacks(i)).ok());
  }
  go.set_value();
  results.Wait();
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(results[i].status().code(), absl::StatusCode::kUnavailable)
        << results[i].status();
  }
  // Only the running ones: the waiting request runs afterwards, whole.
  ASSERT_TRUE(results[3].ok()) << results[3].status();
  EXPECT_EQ(results[3]->tokens.size(), 50u);
  EXPECT_EQ(engine->blocks().used_blocks(), 0);
  auto next = engine->Generate({.prompt = Prompt(5, 1), .max_tokens = 5});
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->tokens.size(), 5u);
}

INSTANTIATE_TEST_SUITE_P(StepsInFlight, PipelinedSchedulerTest,
                         ::testing::Values(1, 2, 3));

// PP stages on threads of this process run steps in flight too (stage 0
// takes the next step while stage 1 finishes one), with the tokens of one
// stage.
TEST_F(SchedulerTest, PipelineStagesOnThreadsRunStepsInFlight) {
  std::vector<GenerateRequest> reqs;
  for (int i = 0; i < 8; ++i) {
    reqs.push_back({.prompt = Prompt(5 + 11 * i, i), .max_tokens = 12});
  }
  for (int pp : {2, 3}) {
    SCOPED_TRACE("pp " + std::to_string(pp));
    Engine* one = MakeEngine({});
    Engine* staged = MakeEngine({.pp = pp});
    ASSERT_NE(one, nullptr);
    ASSERT_NE(staged, nullptr);
    Results want, got;
    for (size_t i = 0; i < reqs.size(); ++i) {
      ASSERT_TRUE(one->Submit(reqs[i], want.Callbacks(i)).ok());
      ASSERT_TRUE(staged->Submit(reqs[i], got.Callbacks(i)).ok());
    }
    want.Wait();
    got.Wait();
    for (size_t i = 0; i < reqs.size(); ++i) {
      ASSERT_TRUE(got[i].ok()) << got[i].status();
      EXPECT_EQ(got[i]->tokens, want[i]->tokens) << "request " << i;
    }
    EXPECT_EQ(staged->stats().max_steps_in_flight, pp);
  }
}

// A cluster re-forming (coordinator --rejoin) drops the workers' KV: the
// request generating fails with the reason, a request without blocks
// stays queued and then runs whole, and the prefix cache is forgotten.
TEST_F(SchedulerTest, DropKvStateFailsHoldersAndForgetsThePrefixCache) {
  Engine* engine = MakeEngine({.kv = {.prefix_caching = true}});
  ASSERT_NE(engine, nullptr);
  ASSERT_TRUE(
      engine->Generate({.prompt = Prompt(64, 2), .max_tokens = 1}).ok());
  ASSERT_GT(engine->blocks().device_usage().cached, 0);

  Results results;
  std::promise<void> generating;
  std::atomic<bool> once{false};
  ASSERT_TRUE(engine
                  ->Submit({.prompt = Prompt(10, 4), .max_tokens = 4000},
                           results.Callbacks(0,
                                             [&](int32_t) {
                                               if (!once.exchange(true)) {
                                                 generating.set_value();
                                               }
                                               return true;
                                             }))
                  .ok());
  generating.get_future().wait();
  engine->DropKvState(absl::UnavailableError("re-forming after rank 3"));
  results.Wait();
  EXPECT_EQ(results[0].status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(results[0].status().message(), "re-forming after rank 3");
  EXPECT_EQ(engine->blocks().used_blocks(), 0);
  EXPECT_EQ(engine->blocks().device_usage().cached, 0);
  auto next = engine->Generate({.prompt = Prompt(64, 2), .max_tokens = 3});
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->tokens.size(), 3u);
}

}  // namespace
}  // namespace shardlm

namespace shardlm {
namespace {

// Records, for every step, how many tokens each sequence had in it.
class RecordingExecutor : public StepExecutor {
 public:
  explicit RecordingExecutor(std::unique_ptr<StepExecutor> inner)
      : inner_(std::move(inner)) {}
  const ModelConfig& config() const override { return inner_->config(); }
  int64_t num_kv_blocks() const override { return inner_->num_kv_blocks(); }
  DType kv_cache_dtype() const override { return inner_->kv_cache_dtype(); }
  int64_t weight_bytes() const override { return inner_->weight_bytes(); }
  absl::StatusOr<StepOutput> Forward(const StepInput& step) override {
    std::map<int64_t, int64_t> tokens;
    for (int32_t s : step.token_seq) ++tokens[step.seq_ids[s]];
    {
      std::lock_guard<std::mutex> lock(mu_);
      steps_.push_back(std::move(tokens));
    }
    return inner_->Forward(step);
  }
  void Release(int64_t seq_id) override { inner_->Release(seq_id); }
  std::vector<std::map<int64_t, int64_t>> steps() {
    std::lock_guard<std::mutex> lock(mu_);
    return steps_;
  }

 private:
  std::unique_ptr<StepExecutor> inner_;
  std::mutex mu_;
  std::vector<std::map<int64_t, int64_t>> steps_;
};

// A long prompt is prefilled one chunk per step beside the streams that
// are decoding: each of them gets its token in every one of those steps.
TEST_F(SchedulerTest, ALongPrefillDelaysDecodingStreamsByOneChunkPerStep) {
  auto inner = CreateInProcessExecutor(*source_, {});
  ASSERT_TRUE(inner.ok()) << inner.status();
  auto recorder = std::make_unique<RecordingExecutor>(std::move(*inner));
  RecordingExecutor* rec = recorder.get();
  Engine* engine = engines_.Keep(Engine::Create(
      std::move(recorder), {.limits = {.max_batched_tokens = 128}}));
  ASSERT_NE(engine, nullptr);
  Results results;
  std::promise<void> decoding;
  std::atomic<int> started{0};
  std::array<std::atomic<bool>, 3> has_token{};
  // Three short streams start decoding first: each has its first token (so
  // its prompt is in the cache) before the long prompt arrives.
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(
        engine
            ->Submit({.prompt = Prompt(8, i), .max_tokens = 60},
                     results.Callbacks(i,
                                       [&, i](int32_t) {
                                         if (!has_token[i].exchange(true) &&
                                             ++started == 3) {
                                           decoding.set_value();
                                         }
                                         return true;
                                       }))
            .ok());
  }
  decoding.get_future().wait();
  // Then a 2000-token prompt: 16 chunks of at most 128 - 3 tokens.
  ASSERT_TRUE(engine
                  ->Submit({.prompt = Prompt(2000, 9), .max_tokens = 2},
                           results.Callbacks(3))
                  .ok());
  results.Wait();
  for (size_t i = 0; i < 4; ++i) ASSERT_TRUE(results[i].ok());
  const RequestId long_id = 3;
  const auto steps = rec->steps();
  // The last step each short stream was in.
  std::map<RequestId, size_t> last;
  for (size_t i = 0; i < steps.size(); ++i) {
    for (RequestId d = 0; d < 3; ++d) {
      if (steps[i].count(d)) last[d] = i;
    }
  }
  int prefill_steps = 0;
  for (size_t i = 0; i < steps.size(); ++i) {
    auto it = steps[i].find(long_id);
    if (it == steps[i].end() || it->second <= 1) continue;  // Not prefilling.
    ++prefill_steps;
    int64_t total = 0;
    for (const auto& [seq, n] : steps[i]) total += n;
    EXPECT_LE(total, 128) << "step " << i;
    for (RequestId d = 0; d < 3; ++d) {
      if (i > last[d]) continue;  // Finished before this step.
      ASSERT_EQ(steps[i].count(d), 1u)
          << "stream " << d << " skipped prefill step " << i;
      EXPECT_EQ(steps[i].at(d), 1);
    }
  }
  EXPECT_GE(prefill_steps, 2000 / 125);
  EXPECT_EQ(engine->blocks().used_blocks(), 0);
}

}  // namespace
}  // namespace shardlm
