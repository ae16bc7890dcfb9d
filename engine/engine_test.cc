// Engine behaviour on a small random model: chunked prefill and batching
// must not change results, and every block comes back.
#include "engine/engine.h"

#include <algorithm>
#include <cmath>

#include "core/max_abs_diff.h"
#include "engine/engine_leak_check.h"
#include "executor/local_engine.h"
#include "gtest/gtest.h"
#include "model/in_memory_weights.h"
#include "testing/status.h"

namespace shardlm {
namespace {

using testing_util::IsError;

// K and V, 3 layers, 16 tokens, 2 KV heads of 16 values, f16 (the
// default KV dtype).
constexpr int64_t kBlockBytes = 2 * 3 * 16 * 2 * 16 * 2;

ModelConfig TinyConfig() {
  ModelConfig c;
  c.n_layers = 3;
  c.hidden = 96;
  c.ffn_hidden = 160;
  c.n_heads = 6;
  c.n_kv_heads = 2;
  c.head_dim = 16;
  c.vocab_size = 301;
  c.context_length = 256;
  c.rope_theta = 10000.0f;
  c.rope_style = RopeStyle::kRotateHalf;
  return c;
}

std::vector<int32_t> Prompt(int n, int salt) {
  std::vector<int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back((i * 37 + salt * 101) % 301);
  return p;
}

class EngineTest : public ::testing::Test {
 protected:
  void TearDown() override { engines_.Close(); }
  Engine* MakeEngine(EngineOptions options = {}) {
    return engines_.Keep(CreateLocalEngine(*source_, options));
  }
  std::unique_ptr<InMemoryWeights> source_ =
      RandomLlamaWeights(TinyConfig(), 1);
  EngineLeakCheck engines_;
};

TEST_F(EngineTest, ChunkedPrefillEqualsOneShot) {
  auto whole = MakeEngine();
  auto chunked = MakeEngine({.limits = {.max_batched_tokens = 7}});
  const GenerateRequest req{
      .prompt = Prompt(40, 1), .max_tokens = 12, .return_prompt_logits = true};
  auto a = whole->Generate(req);
  auto b = chunked->Generate(req);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_EQ(a->prompt_logits.size(), 301u);
  EXPECT_LT(MaxAbsDiff(a->prompt_logits, b->prompt_logits), 1e-4);
  EXPECT_EQ(a->tokens, b->tokens);
  EXPECT_EQ(a->tokens.size(), 12u);
  EXPECT_EQ(a->finish_reason, FinishReason::kLength);
}

// --threads reaches the kernels: the steps run on the scheduler's loop
// thread, whose OpenMP setting is its own (it used to stay at every core).
TEST_F(EngineTest, ThreadsReachTheKernelsOnTheSchedulerThread) {
  for (int threads : {1, 3}) {
    auto engine = MakeEngine({.threads = threads});
    ASSERT_TRUE(
        engine->Generate({.prompt = Prompt(5, 2), .max_tokens = 2}).ok());
    const auto stats = engine->executor().RankStats();
    ASSERT_EQ(stats.size(), 1u);
    EXPECT_GT(stats[0].steps, 0);
    EXPECT_EQ(stats[0].cpu_threads, threads);
  }
}

TEST_F(EngineTest, BatchingGivesEachRequestItsOwnTokens) {
  auto engine = MakeEngine({.limits = {.max_batched_tokens = 16}});
  std::vector<GenerateRequest> reqs;
  for (int i = 0; i < 5; ++i) {
    reqs.push_back({.prompt = Prompt(1 + 13 * i, i), .max_tokens = 9 + i});
  }
  // One request samples: its draws depend only on (seed, step).
  reqs[2].sampling = {.temperature = 0.9f, .top_p = 0.9f, .seed = 5};
  auto batched = engine->GenerateBatch(reqs);
  ASSERT_TRUE(batched.ok()) << batched.status();
  // The reference runs each request alone on an engine of its own with no
  // prefix cache, so that it reuses no KV the batched run wrote.
  auto reference = MakeEngine({.kv = {.prefix_caching = false}});
  for (size_t i = 0; i < reqs.size(); ++i) {
    auto alone = reference->Generate(reqs[i]);
    ASSERT_TRUE(alone.ok());
    EXPECT_EQ((*batched)[i].tokens, alone->tokens) << "request " << i;
  }
  EXPECT_EQ(engine->blocks().used_blocks(), 0);
}

TEST_F(EngineTest, WaitsForBlocksWhenTheCacheIsShort) {
  // 8 blocks of 16: each request needs 4, so at most two run at once.
  const int64_t block_bytes = kBlockBytes;
  auto engine = MakeEngine({.kv = {.kv_cache_bytes = 8 * block_bytes}});
  ASSERT_EQ(engine->blocks().num_blocks(), 8);
  std::vector<GenerateRequest> reqs(
      5, {.prompt = Prompt(30, 3), .max_tokens = 30});
  // The five cannot all hold their blocks at once (the shared first
  // prompt block included they need 16 of 8), so some request waited:
  // either at admission (its first token came after another request's
  // last) or by preemption (its KV dropped and recomputed later).
  std::vector<int64_t> first(reqs.size(), -1), last(reqs.size(), -1);
  int64_t seq = 0;
  auto results = engine->GenerateBatch(reqs, [&](size_t i, int32_t) {
    if (first[i] < 0) first[i] = seq;
    last[i] = seq++;
    return true;
  });
  ASSERT_TRUE(results.ok()) << results.status();
  // Each equals the request run alone with room to spare and no prefix
  // cache, whether it waited, shared the prompt's blocks or was recomputed.
  auto alone = MakeEngine({.kv = {.prefix_caching = false}})->Generate(reqs[0]);
  ASSERT_TRUE(alone.ok()) << alone.status();
  for (const auto& r : *results) {
    EXPECT_EQ(r.tokens.size(), 30u);
    EXPECT_EQ(r.tokens, alone->tokens);
  }
  const bool waited_to_start = *std::max_element(first.begin(), first.end()) >
                               *std::min_element(last.begin(), last.end());
  EXPECT_TRUE(waited_to_start || engine->stats().preempted_recompute > 0)
      << "no request waited for blocks";
  EXPECT_EQ(engine->blocks().used_blocks(), 0);
}

TEST_F(EngineTest, StopTokensAndCancellationFreeBlocks) {
  auto engine = MakeEngine();
  auto free_run = engine->Generate({.prompt = Prompt(5, 2), .max_tokens = 10});
  ASSERT_TRUE(free_run.ok());
  const int32_t third = free_run->tokens[2];
  auto stopped = engine->Generate(
      {.prompt = Prompt(5, 2), .max_tokens = 10, .stop_token_ids = {third}});
  ASSERT_TRUE(stopped.ok());
  EXPECT_EQ(stopped->finish_reason, FinishReason::kStop);
  // Stops at the first occurrence, which may come before position 2.
  EXPECT_LE(stopped->tokens.size(), 3u);
  EXPECT_EQ(stopped->tokens.back(), third);

  int seen = 0;
  auto cancelled = engine->Generate({.prompt = Prompt(5, 2), .max_tokens = 10},
                                    [&](int32_t) { return ++seen < 4; });
  ASSERT_TRUE(cancelled.ok());
  EXPECT_EQ(cancelled->finish_reason, FinishReason::kCancelled);
  EXPECT_EQ(cancelled->tokens.size(), 4u);
  EXPECT_EQ(engine->blocks().used_blocks(), 0);
}

TEST_F(EngineTest, RejectsBadRequestsUpFrontAndAllocatesNothing) {
  const int64_t block_bytes = kBlockBytes;
  auto engine = MakeEngine({.kv = {.kv_cache_bytes = 4 * block_bytes}});
  // Each bad request, and a piece of the reason it must be refused for.
  const std::vector<std::pair<GenerateRequest, std::string>> bad = {
      {{.prompt = {}, .max_tokens = 4}, "the prompt is empty"},
      {{.prompt = {1, 301}, .max_tokens = 4},
       "prompt token 301 is outside the vocabulary of 301"},
      {{.prompt = {1, -1}, .max_tokens = 4},
       "prompt token -1 is outside the vocabulary"},
      {{.prompt = {1}, .max_tokens = 0}, "max_tokens must be >= 1, got 0"},
      {{.prompt = Prompt(200, 1), .max_tokens = 100},  // > context 256.
       "exceeds the context window of 256"},
      {{.prompt = Prompt(60, 1), .max_tokens = 10},  // > 4 blocks of 16.
       "need 5 KV blocks of 16 tokens but the cache holds 4"},
      {{.prompt = {1}, .max_tokens = 4, .sampling = {.temperature = -1}},
       "temperature must be >= 0"},
      {{.prompt = {1}, .max_tokens = 4, .sampling = {.top_p = 2}},
       "top_p must be in (0, 1]"},
  };
  for (size_t i = 0; i < bad.size(); ++i) {
    auto r = engine->GenerateBatch(
        {{.prompt = {1, 2}, .max_tokens = 2}, bad[i].first});
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << i;
    EXPECT_NE(r.status().message().find("request 1"), absl::string_view::npos)
        << r.status();
    EXPECT_NE(r.status().message().find(bad[i].second), absl::string_view::npos)
        << "row " << i << ": " << r.status();
    EXPECT_EQ(engine->blocks().used_blocks(), 0);
  }
}

TEST(EngineCreateTest, RejectsBadOptions) {
  auto source = RandomLlamaWeights(TinyConfig(), 1);
  const auto kInvalid = absl::StatusCode::kInvalidArgument;
  EXPECT_TRUE(IsError(CreateLocalEngine(*source, {.kv = {.block_size = 0}}),
                      kInvalid, "--block-size 0 is outside"));
  EXPECT_TRUE(
      IsError(CreateLocalEngine(*source, {.kv = {.kv_cache_bytes = 10}}),
              kInvalid, "KV cache budget of 10 bytes holds no block"));
  EXPECT_TRUE(IsError(
      CreateLocalEngine(*source, {.limits = {.max_batched_tokens = -1}}),
      kInvalid, "--max-batched-tokens -1 is outside"));
  EXPECT_TRUE(IsError(CreateLocalEngine(*source, {.cp = 0}), kInvalid,
                      "--cp must be >= 1, got 0"));
  // An executor built elsewhere is held to the same options.
  auto executor = MakeExecutor(*source, {});
  ASSERT_TRUE(executor.ok()) << executor.status();
  EXPECT_TRUE(
      IsError(Engine::Create(std::move(*executor), {.limits = {.max_seqs = 0}}),
              kInvalid, "--max-seqs 0 is outside"));
}

}  // namespace
}  // namespace shardlm
