// KV tiers on a small random model: preemption by swapping to the host
// tier (and by recomputing when the host is full), a sequence larger than
// the device pool running through the host tier, and prefix caching. Every
// test compares tokens with the same request run alone on an engine with a
// full-size device pool and no cache sharing.
#include <atomic>
#include <cstdlib>
#include <future>
#include <thread>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "engine/engine.h"
#include "executor/scheduler_test_util.h"
#include "gtest/gtest.h"
#include "model/in_memory_weights.h"
#include "worker/kv_pool.h"

namespace shardlm {
namespace {

// Every test runs with each KV cache dtype (budgets are in blocks of it).
// And with 1 or 3 steps in flight (pipeline parallel overlap).
class KvTiersTest
    : public TinyEngineTest,
      public ::testing::WithParamInterface<std::tuple<DType, int>> {
 protected:
  KvTiersTest() : TinyEngineTest(4096, 5) {}
  DType dtype() const { return std::get<0>(GetParam()); }
  Engine* MakeEngine(EngineOptions options) {
    options.kv.dtype = dtype();
    return TinyEngineTest::MakeEngine(options, std::get<1>(GetParam()));
  }
  // One block (16 tokens) of the tiny model's K and V in the dtype under
  // test.
  int64_t block_bytes() const {
    return 16 * KvBytesPerToken(source_->config(), dtype());
  }
  // Each request alone, with room for a full context and no prefix cache.
  std::vector<GenerateResult> Alone(const std::vector<GenerateRequest>& reqs) {
    auto engine = MakeEngine({.kv = {.prefix_caching = false}});
    std::vector<GenerateResult> out;
    for (const auto& r : reqs) {
      auto got = engine->Generate(r);
      EXPECT_TRUE(got.ok()) << got.status();
      out.push_back(got.ok() ? *got : GenerateResult{});
    }
    return out;
  }
  // Submits all at once and waits for every result.
  void RunTogether(Engine& engine, const std::vector<GenerateRequest>& reqs,
                   Results& results) {
    for (size_t i = 0; i < reqs.size(); ++i) {
      auto id = engine.Submit(reqs[i], results.Callbacks(i));
      ASSERT_TRUE(id.ok()) << id.status();
    }
    results.Wait();
  }
};

std::vector<GenerateRequest> MixedRequests(int n) {
  std::vector<GenerateRequest> reqs;
  for (int i = 0; i < n; ++i) {
    reqs.push_back(
        {.prompt = Prompt(20 + (i * 29) % 100, i), .max_tokens = 24 + i % 16});
  }
  reqs[3].sampling = {.temperature = 0.8f, .top_k = 40, .seed = 3};
  return reqs;
}

TEST_P(KvTiersTest, PreemptedSequencesSwapToTheHostAndBack) {
  const auto reqs = MixedRequests(32);
  const auto alone = Alone(reqs);
  // 24 device blocks hold about 3 of these at once; the host holds all.
  auto engine = MakeEngine({.kv = {.kv_cache_bytes = 24 * block_bytes(),
                                   .cpu_offload_bytes = 400 * block_bytes(),
                                   .prefix_caching = false},
                            .limits = {.max_batched_tokens = 128}});
  Results results;
  RunTogether(*engine, reqs, results);
  for (size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_TRUE(results[i].ok()) << i << ": " << results[i].status();
    EXPECT_EQ(results[i]->tokens, alone[i].tokens) << "request " << i;
  }
  const SchedulerStats st = engine->stats();
  EXPECT_GT(st.preempted_swap, 0);
  EXPECT_EQ(st.preempted_recompute, 0) << "the host had room for every swap";
  EXPECT_GT(st.blocks.swapped_out, 0);
  EXPECT_EQ(st.blocks.swapped_in, st.blocks.swapped_out)
      << "each request fits the device alone, so none reads the host tier";
  EXPECT_EQ(engine->blocks().used_blocks(), 0);
  EXPECT_EQ(st.device.used + st.host.used, 0);
  std::printf(
      "32 requests, 24 device blocks: %lld swap preemptions, %lld "
      "blocks out, %lld in, %lld steps\n",
      static_cast<long long>(st.preempted_swap),
      static_cast<long long>(st.blocks.swapped_out),
      static_cast<long long>(st.blocks.swapped_in),
      static_cast<long long>(st.steps));
}

// --kv-checksum: the same swaps find every block as it was copied out (no
// false alarm); with one byte of one host block flipped (the test hook of
// worker/kv_pool.h), the step that copies it back produces no token: its
// sequences are recomputed, every request still ends with the tokens of
// the request alone, and the failure is counted once.
TEST_P(KvTiersTest, HostBlocksThatFailTheirChecksumAreRecomputed) {
  const auto reqs = MixedRequests(24);
  const auto alone = Alone(reqs);
  for (const bool corrupt : {false, true}) {
    if (corrupt) setenv(KvPool::kCorruptEnv, "5", 1);
    auto engine = MakeEngine({.kv = {.kv_cache_bytes = 24 * block_bytes(),
                                     .cpu_offload_bytes = 400 * block_bytes(),
                                     .prefix_caching = false,
                                     .checksum = true},
                              .limits = {.max_batched_tokens = 128}});
    unsetenv(KvPool::kCorruptEnv);
    ASSERT_NE(engine, nullptr);
    Results results;
    RunTogether(*engine, reqs, results);
    for (size_t i = 0; i < reqs.size(); ++i) {
      ASSERT_TRUE(results[i].ok()) << i << ": " << results[i].status();
      EXPECT_EQ(results[i]->tokens, alone[i].tokens)
          << "request " << i << (corrupt ? " (a block corrupted)" : "");
    }
    const SchedulerStats st = engine->stats();
    EXPECT_GT(st.blocks.swapped_in, 5);
    EXPECT_EQ(st.kv_checksum_failures, corrupt ? 1 : 0);
    EXPECT_EQ(st.interruptions, corrupt ? 1 : 0);
    EXPECT_EQ(engine->blocks().used_blocks(), 0);
  }
}

TEST_P(KvTiersTest, WithoutAHostTierPreemptedSequencesAreRecomputed) {
  const auto reqs = MixedRequests(16);
  const auto alone = Alone(reqs);
  auto engine = MakeEngine(
      {.kv = {.kv_cache_bytes = 20 * block_bytes(), .prefix_caching = false},
       .limits = {.max_batched_tokens = 128}});
  Results results;
  RunTogether(*engine, reqs, results);
  for (size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_TRUE(results[i].ok()) << i << ": " << results[i].status();
    EXPECT_EQ(results[i]->tokens, alone[i].tokens) << "request " << i;
  }
  EXPECT_GT(engine->stats().preempted_recompute, 0);
  EXPECT_EQ(engine->stats().preempted_swap, 0);
  EXPECT_EQ(engine->blocks().used_blocks(), 0);
}

TEST_P(KvTiersTest, AHigherPriorityArrivalPreemptsARunningRequest) {
  const std::vector<GenerateRequest> reqs = {
      {.prompt = Prompt(100, 1), .max_tokens = 50, .priority = 0},
      {.prompt = Prompt(100, 2), .max_tokens = 8, .priority = 5}};
  const auto alone = Alone(reqs);
  // 10 device blocks: either request alone, not both.
  auto engine = MakeEngine({.kv = {.kv_cache_bytes = 10 * block_bytes(),
                                   .cpu_offload_bytes = 40 * block_bytes(),
                                   .prefix_caching = false}});
  Results results;
  std::promise<void> started, submitted;
  std::shared_future<void> arrived = submitted.get_future().share();
  std::atomic<int> low_tokens{0};
  // After its 5th token the low-priority request waits (on the loop
  // thread, which holds no lock in on_token) until the high-priority one
  // is queued, so it cannot finish first however fast the steps are.
  const auto on_low_token = [&](int32_t) {
    if (++low_tokens == 5) {
      started.set_value();
      arrived.wait();
    }
    return true;
  };
  ASSERT_TRUE(engine->Submit(reqs[0], results.Callbacks(0, on_low_token)).ok());
  started.get_future().wait();
  ASSERT_TRUE(engine->Submit(reqs[1], results.Callbacks(1)).ok());
  submitted.set_value();
  results.Wait();
  EXPECT_EQ(results.order(), (std::vector<size_t>{1, 0}));
  for (size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_TRUE(results[i].ok()) << results[i].status();
    EXPECT_EQ(results[i]->tokens, alone[i].tokens) << "request " << i;
  }
  EXPECT_EQ(engine->stats().preempted_swap, 1);
  EXPECT_EQ(engine->blocks().used_blocks(), 0);
}

TEST_P(KvTiersTest, APromptLargerThanTheDevicePoolRunsThroughTheHostTier) {
  // 8 device blocks hold 128 tokens; the prompt is 1000.
  const std::vector<GenerateRequest> reqs = {
      {.prompt = Prompt(1000, 7), .max_tokens = 20},
      {.prompt = Prompt(900, 8),
       .max_tokens = 12,
       .sampling = {.temperature = 0.7f, .top_p = 0.9f, .seed = 1}}};
  const auto alone = Alone(reqs);
  auto engine = MakeEngine({.kv = {.kv_cache_bytes = 8 * block_bytes(),
                                   .cpu_offload_bytes = 80 * block_bytes()},
                            .limits = {.max_batched_tokens = 64}});
  Results results;
  RunTogether(*engine, reqs, results);
  for (size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_TRUE(results[i].ok()) << i << ": " << results[i].status();
    EXPECT_EQ(results[i]->tokens, alone[i].tokens) << "request " << i;
  }
  EXPECT_GT(engine->stats().offloaded, 50);
  EXPECT_EQ(engine->blocks().used_blocks(), 0);

  // Larger than both tiers: refused up front with the numbers.
  auto too_long =
      engine->Submit({.prompt = Prompt(1400, 1), .max_tokens = 20}, {});
  EXPECT_EQ(too_long.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(too_long.status().message().find(
                "need 89 KV blocks of 16 tokens but the cache holds 88 (8 "
                "device + 80 host)"),
            absl::string_view::npos)
      << too_long.status();
}

TEST_P(KvTiersTest, ASharedPrefixIsComputedOnce) {
  const std::vector<int32_t> prefix = Prompt(1024, 9);
  std::vector<GenerateRequest> reqs(2);
  for (int i = 0; i < 2; ++i) {
    reqs[i].prompt = prefix;
    const auto tail = Prompt(30 + 10 * i, 20 + i);
    reqs[i].prompt.insert(reqs[i].prompt.end(), tail.begin(), tail.end());
    reqs[i].max_tokens = 16;
  }
  const auto alone = Alone(reqs);
  auto engine = MakeEngine({});
  ASSERT_TRUE(engine->blocks().prefix_caching());
  auto first = engine->Generate(reqs[0]);
  ASSERT_TRUE(first.ok()) << first.status();
  const SchedulerStats before = engine->stats();
  auto second = engine->Generate(reqs[1]);
  ASSERT_TRUE(second.ok()) << second.status();
  const SchedulerStats after = engine->stats();
  EXPECT_EQ(first->tokens, alone[0].tokens);
  EXPECT_EQ(second->tokens, alone[1].tokens);
  const int64_t hit =
      after.blocks.prefix_hit_tokens - before.blocks.prefix_hit_tokens;
  const int64_t computed = after.computed_tokens - before.computed_tokens;
  EXPECT_EQ(hit, 1024);
  // Only the 40-token remainder is prefilled, then 15 decode steps.
  EXPECT_EQ(computed, 40 + 15);
  std::printf(
      "shared 1024-token prefix: second request hit %lld of %zu "
      "prompt tokens (%.1f%%), computed %lld tokens\n",
      static_cast<long long>(hit), reqs[1].prompt.size(),
      100.0 * hit / reqs[1].prompt.size(), static_cast<long long>(computed));

  // The very same prompt again: all but its last token come from the cache.
  const SchedulerStats again_before = engine->stats();
  auto again = engine->Generate(reqs[1]);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->tokens, alone[1].tokens);
  EXPECT_EQ(
      engine->stats().computed_tokens - again_before.computed_tokens,
      (reqs[1].prompt.size() % 16 == 0 ? 16 : reqs[1].prompt.size() % 16) + 15);
  EXPECT_EQ(engine->blocks().used_blocks(), 0);
}

TEST_P(KvTiersTest, EvictedPrefixBlocksSpillToTheHostAndStillHit) {
  const std::vector<GenerateRequest> reqs = {
      {.prompt = Prompt(200, 1), .max_tokens = 4},
      {.prompt = Prompt(300, 2), .max_tokens = 4},  // Evicts the first.
      {.prompt = Prompt(200, 1), .max_tokens = 4}};
  const auto alone = Alone(reqs);
  auto engine = MakeEngine({.kv = {.kv_cache_bytes = 24 * block_bytes(),
                                   .cpu_offload_bytes = 40 * block_bytes()}});
  for (size_t i = 0; i < reqs.size(); ++i) {
    const SchedulerStats before = engine->stats();
    auto got = engine->Generate(reqs[i]);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->tokens, alone[i].tokens) << i;
    if (i == 2) {
      const SchedulerStats after = engine->stats();
      EXPECT_EQ(
          after.blocks.prefix_hit_tokens - before.blocks.prefix_hit_tokens,
          192);  // 12 full blocks, back from the host.
    }
  }
  EXPECT_GT(engine->stats().blocks.spilled, 0);
  EXPECT_EQ(engine->blocks().used_blocks(), 0);
}

// Each dtype once, and 1 and 3 steps in flight with two dtypes each: the
// full product (8 per test, 56 cases) was the largest share of
// engine_test's time under the sanitizers, and neither parameter's
// code depends on the other's value.
INSTANTIATE_TEST_SUITE_P(
    KvDTypes, KvTiersTest,
    ::testing::Values(std::tuple{DType::kF32, 1}, std::tuple{DType::kF16, 3},
                      std::tuple{DType::kBF16, 1}, std::tuple{DType::kI8, 3}),
    [](const auto& info) {
      return absl::StrCat(DTypeName(std::get<0>(info.param)), "_",
                          std::get<1>(info.param), "InFlight");
    });

}  // namespace
}  // namespace shardlm
