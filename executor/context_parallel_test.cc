// Context parallelism (issue #35 part 2, DESIGN.md section 3): CP ranks of
// a stage hold the same weights and each 1/cp of a sequence's KV blocks;
// each attends over its own blocks and the parts are merged exactly by
// their log-sum-exp. So every CP layout (alone and with TP and PP) must give
// the tokens of CP = 1, and logits and every decode step's top
// log-probabilities within the f32 reassociation bound; and a prompt that
// one rank's pool cannot hold is served at CP = 2 as CP = 1 serves it with
// twice the pool. Shards run on threads with in-process communicators.
#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "core/max_abs_diff.h"
#include "core/status.h"
#include "engine/engine.h"
#include "engine/engine_leak_check.h"
#include "executor/local_engine.h"
#include "gtest/gtest.h"
#include "model/in_memory_weights.h"
#include "model/smollm2_test_model.h"
#include "testing/status.h"

namespace shardlm {
namespace {

struct Layout {
  int tp, pp, cp;
};

std::string Name(const Layout& l) {
  return absl::StrCat("tp", l.tp, "_pp", l.pp, "_cp", l.cp);
}

std::vector<int32_t> Prompt(int n, int salt, int vocab) {
  std::vector<int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back((i * 7919 + salt * 104729) % vocab);
  return p;
}

ModelConfig RandomConfig() {
  ModelConfig c;
  c.n_layers = 4;
  c.hidden = 64;
  c.ffn_hidden = 160;
  c.n_heads = 8;
  c.n_kv_heads = 4;
  c.head_dim = 8;
  c.vocab_size = 311;
  c.context_length = 512;
  c.rope_theta = 10000.0f;
  c.rope_style = RopeStyle::kRotateHalf;
  return c;
}

// kv_cache_bytes and cpu_offload_bytes are per rank (0: a full context on
// the device, no host tier); `stats`, when set, gets the engine's figures
// after the batch.
absl::StatusOr<std::vector<GenerateResult>> RunLayout(
    const WeightSource& source, const Layout& l,
    const std::vector<GenerateRequest>& reqs, int chunk,
    int64_t kv_cache_bytes = 0, int64_t* blocks = nullptr,
    int64_t cpu_offload_bytes = 0, SchedulerStats* stats = nullptr) {
  EngineLeakCheck engines;
  auto engine =
      CreateLocalEngine(source, {.kv = {.kv_cache_bytes = kv_cache_bytes,
                                        .cpu_offload_bytes = cpu_offload_bytes,
                                        .dtype = DType::kF32},
                                 .limits = {.max_batched_tokens = chunk},
                                 .threads = 1,
                                 .tp = l.tp,
                                 .pp = l.pp,
                                 .cp = l.cp});
  RETURN_IF_ERROR(engine.status());
  Engine* e = engines.Keep(std::move(engine));
  // One runner per rank.
  EXPECT_EQ(e->executor().RankStats().size(),
            static_cast<size_t>(l.tp * l.pp * l.cp));
  if (blocks != nullptr) *blocks = e->blocks().num_blocks();
  auto out = e->GenerateBatch(reqs);
  if (stats != nullptr) *stats = e->stats();
  return out;
}

// f32 K and V of every layer and KV head of `c`, one block of 16 tokens.
int64_t BlockBytes(const ModelConfig& c) {
  return 2 * c.n_layers * c.n_kv_heads * c.head_dim * 4 * 16;
}

// The top log-probabilities every request asks for (Requests()).
constexpr int kTopLogprobs = 5;

// Greedy tokens equal; the prompt's last logits, each decode step's
// sampled log-probability and its top-k (by rank) within tol. The
// log-probabilities are as the requests asked (one per token, kTopLogprobs
// each), not only as many in `got` as in `want`.
void ExpectSame(const std::vector<GenerateResult>& got,
                const std::vector<GenerateResult>& want, double tol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("prompt ", i));
    EXPECT_EQ(got[i].tokens, want[i].tokens);
    EXPECT_LT(MaxAbsDiff(got[i].prompt_logits, want[i].prompt_logits), tol);
    ASSERT_EQ(got[i].logprobs.size(), got[i].tokens.size());
    ASSERT_EQ(want[i].logprobs.size(), want[i].tokens.size());
    ASSERT_EQ(got[i].logprobs.size(), want[i].logprobs.size());
    for (size_t t = 0; t < got[i].logprobs.size(); ++t) {
      const TokenLogprobs& a = got[i].logprobs[t];
      const TokenLogprobs& b = want[i].logprobs[t];
      EXPECT_NEAR(a.sampled, b.sampled, 2 * tol) << "step " << t;
      ASSERT_EQ(a.top.size(), static_cast<size_t>(kTopLogprobs));
      ASSERT_EQ(b.top.size(), static_cast<size_t>(kTopLogprobs));
      for (size_t k = 0; k < a.top.size(); ++k) {
        EXPECT_NEAR(a.top[k].logprob, b.top[k].logprob, 2 * tol)
            << "step " << t << ", top " << k;
      }
    }
  }
}

std::vector<GenerateRequest> Requests(
    const std::vector<std::vector<int32_t>>& prompts, int steps) {
  std::vector<GenerateRequest> reqs;
  for (const auto& p : prompts) {
    reqs.push_back({.prompt = p,
                    .max_tokens = steps,
                    .return_prompt_logits = true,
                    .logprobs = kTopLogprobs});
  }
  return reqs;
}

void ExpectEquivalent(const WeightSource& source,
                      const std::vector<Layout>& layouts,
                      const std::vector<GenerateRequest>& reqs, int chunk,
                      double tol) {
  auto base = RunLayout(source, {1, 1, 1}, reqs, chunk);
  ASSERT_TRUE(base.ok()) << base.status();
  for (const Layout& l : layouts) {
    SCOPED_TRACE(Name(l));
    auto got = RunLayout(source, l, reqs, chunk);
    ASSERT_TRUE(got.ok()) << got.status();
    ExpectSame(*got, *base, tol);
    double err = 0;
    for (size_t i = 0; i < reqs.size(); ++i) {
      err = std::max(
          err, MaxAbsDiff((*got)[i].prompt_logits, (*base)[i].prompt_logits));
    }
    std::printf("[%s] max |dlogit| vs tp1_pp1_cp1: %.3g\n", Name(l).c_str(),
                err);
  }
}

// Prompts of 5 tokens (one block of 16, partly filled), 16 (one full
// block), 17 (ends one token into the second), 37 and 70 (mid-block),
// batched and prefilled in chunks of 13 so that chunks cross blocks and
// CP ranks; 24 decode steps each cross further blocks.
TEST(ContextParallelTest, RandomModelMatchesCp1) {
  auto source = RandomLlamaWeights(RandomConfig(), 3);
  std::vector<std::vector<int32_t>> prompts;
  int salt = 0;
  for (int n : {5, 16, 17, 37, 70}) prompts.push_back(Prompt(n, salt++, 311));
  ExpectEquivalent(*source,
                   {{1, 1, 2}, {1, 1, 3}, {2, 1, 2}, {1, 2, 2}, {2, 2, 2}},
                   Requests(prompts, 24), 13, 1e-4);
}

// Each prompt alone: a lone single-block prompt leaves one CP rank with no
// key at all for every step until the sequence reaches the second block.
TEST(ContextParallelTest, RandomModelSingleSequences) {
  auto source = RandomLlamaWeights(RandomConfig(), 4);
  for (int n : {1, 3, 16, 33}) {
    SCOPED_TRACE(absl::StrCat(n, "-token prompt"));
    ExpectEquivalent(*source, {{1, 1, 2}, {2, 2, 2}},
                     Requests({Prompt(n, n, 311)}, 20), 512, 1e-4);
  }
}

// Sliding-window attention (Mistral-style, every layer, 20 positions): a
// query's window may start inside one rank's block and leave the other
// rank's blocks wholly behind it.
TEST(ContextParallelTest, SlidingWindowMatchesCp1) {
  ModelConfig c = RandomConfig();
  c.sliding_window = 20;
  auto source = RandomLlamaWeights(c, 6);
  std::vector<std::vector<int32_t>> prompts;
  for (int n : {7, 45}) prompts.push_back(Prompt(n, n, 311));
  ExpectEquivalent(*source, {{1, 1, 2}, {1, 1, 3}}, Requests(prompts, 30), 13,
                   1e-4);
}

// A Qwen3-MoE-shaped mixture (QK norms, 8 experts, top 2): under sequence
// parallel each CP rank routes and runs only its slice's tokens.
TEST(ContextParallelTest, MixtureOfExpertsMatchesCp1) {
  ModelConfig c = RandomConfig();
  c.architecture = "qwen3moe";
  c.qk_norm = true;
  c.n_experts = 8;
  c.n_experts_used = 2;
  c.expert_ffn_hidden = 128;
  auto source = RandomLlamaWeights(c, 11);
  std::vector<std::vector<int32_t>> prompts;
  for (int n : {5, 37}) prompts.push_back(Prompt(n, n, 311));
  ExpectEquivalent(*source, {{1, 1, 2}, {2, 1, 2}, {1, 1, 3}},
                   Requests(prompts, 12), 13, 1e-4);
}

// SmolLM2-135M (9 query / 3 KV heads: TP 2 splits them unevenly).
TEST(ContextParallelTest, SmolLm2MatchesCp1) {
  const std::string path = testing_util::SmolLm2ModelPath();
  ASSERT_FALSE(path.empty());
  auto source = OpenWeights(path);
  ASSERT_TRUE(source.ok()) << source.status();
  // "The capital of France is" (one block), a ChatML turn of exactly 16
  // tokens, and 40 mixed ids (mid-block).
  std::vector<std::vector<int32_t>> prompts = {
      {504, 3575, 282, 4649, 314},
      {1, 4093, 198, 1780, 314, 216, 34, 27, 34, 47, 2, 198, 1, 520, 9531, 198},
      Prompt(40, 5, 49152)};
  ExpectEquivalent(**source, {{1, 1, 2}, {2, 1, 2}, {2, 2, 2}},
                   Requests(prompts, 16), 512, 1e-3);
}

// A rank's pool of 8 blocks (128 tokens) cannot hold 150 + 20 tokens (11
// blocks): refused at CP = 1 with the numbers; at CP = 2 each rank keeps
// its 8-block pool, the group holds 16, and the text is that of CP = 1
// given twice the pool.
TEST(ContextParallelTest, CapacityGrowsWithCp) {
  const ModelConfig c = RandomConfig();
  auto source = RandomLlamaWeights(c, 5);
  // f32 K and V of every layer and KV head, 16 tokens.
  const int64_t block_bytes =
      2 * c.n_layers * c.n_kv_heads * c.head_dim * 4 * 16;
  const std::vector<GenerateRequest> reqs = Requests({Prompt(150, 1, 311)}, 20);
  int64_t blocks = 0;
  auto small =
      RunLayout(*source, {1, 1, 1}, reqs, 64, 8 * block_bytes, &blocks);
  EXPECT_EQ(blocks, 8);
  EXPECT_TRUE(testing_util::IsError(
      small, absl::StatusCode::kInvalidArgument,
      "170 tokens need 11 KV blocks of 16 tokens but the cache holds 8"));
  auto twice =
      RunLayout(*source, {1, 1, 1}, reqs, 64, 16 * block_bytes, &blocks);
  ASSERT_TRUE(twice.ok()) << twice.status();
  EXPECT_EQ(blocks, 16);
  for (const Layout& l : {Layout{1, 1, 2}, Layout{2, 1, 2}}) {
    SCOPED_TRACE(Name(l));
    // A TP rank holds 1/tp of the KV heads: 8 blocks per rank again.
    auto cp = RunLayout(*source, l, reqs, 64, 8 * block_bytes / l.tp, &blocks);
    ASSERT_TRUE(cp.ok()) << cp.status();
    EXPECT_EQ(blocks, 16);  // Two ranks of 8.
    ExpectSame(*cp, *twice, 1e-4);
  }
  // And CP = 2 has a limit too, stated per rank.
  auto too_long =
      RunLayout(*source, {1, 1, 2}, Requests({Prompt(300, 2, 311)}, 20), 64,
                8 * block_bytes);
  EXPECT_TRUE(testing_util::IsError(
      too_long, absl::StatusCode::kInvalidArgument,
      "the cache holds 16 (16 device + 0 host over 2 CP ranks, 8 each)"));
}

// A host tier under CP: a block swapped out, spilled or offloaded stays on
// its CP rank (each rank's host pool holds its own blocks, every tier copy
// is within one rank). Six requests on a device pool of 6 blocks per rank
// preempt one another (swapped to the host and back): the tokens and
// every step's logprobs are those of CP = 1 with a full-size pool.
TEST(ContextParallelTest, SwappedOutBlocksMatchCp1) {
  const ModelConfig c = RandomConfig();
  auto source = RandomLlamaWeights(c, 8);
  std::vector<std::vector<int32_t>> prompts;
  for (int n : {40, 57, 70, 33, 90, 64}) prompts.push_back(Prompt(n, n, 311));
  const std::vector<GenerateRequest> reqs = Requests(prompts, 24);
  auto base = RunLayout(*source, {1, 1, 1}, reqs, 32);
  ASSERT_TRUE(base.ok()) << base.status();
  for (const Layout& l : {Layout{1, 1, 2}, Layout{2, 1, 2}, Layout{1, 1, 3}}) {
    SCOPED_TRACE(Name(l));
    SchedulerStats st;
    // A TP rank holds 1/tp of the KV heads: 6 device and 40 host blocks
    // per rank whatever the TP degree.
    auto got = RunLayout(*source, l, reqs, 32, 6 * BlockBytes(c) / l.tp,
                         nullptr, 40 * BlockBytes(c) / l.tp, &st);
    ASSERT_TRUE(got.ok()) << got.status();
    ExpectSame(*got, *base, 1e-4);
    EXPECT_GT(st.preempted_swap, 0);
    EXPECT_GT(st.blocks.swapped_in, 0);
    EXPECT_EQ(st.device.used + st.host.used, 0);
    std::printf("[%s] %lld swap preemptions, %lld blocks out, %lld in\n",
                Name(l).c_str(), static_cast<long long>(st.preempted_swap),
                static_cast<long long>(st.blocks.swapped_out),
                static_cast<long long>(st.blocks.swapped_in));
  }
}

// Under pressure on both tiers (6 device and 3 host blocks per rank),
// preemption swaps where every block has a host block of its own rank
// and recomputes where not: twelve requests at CP 2 still give CP 1's
// tokens and logprobs, and every block comes back.
TEST(ContextParallelTest, HostTierExhaustionFallsBackToRecompute) {
  const ModelConfig c = RandomConfig();
  auto source = RandomLlamaWeights(c, 9);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 12; ++i)
    prompts.push_back(Prompt(20 + (i * 29) % 70, i, 311));
  const std::vector<GenerateRequest> reqs = Requests(prompts, 16);
  auto base = RunLayout(*source, {1, 1, 1}, reqs, 32);
  ASSERT_TRUE(base.ok()) << base.status();
  SchedulerStats st;
  auto got = RunLayout(*source, {1, 1, 2}, reqs, 32, 6 * BlockBytes(c), nullptr,
                       3 * BlockBytes(c), &st);
  ASSERT_TRUE(got.ok()) << got.status();
  ExpectSame(*got, *base, 1e-4);
  EXPECT_GT(st.preempted_swap + st.preempted_recompute, 0);
  EXPECT_EQ(st.device.used + st.host.used, 0);
  std::printf(
      "cp 2, 6 + 3 blocks per rank: %lld swap and %lld recompute "
      "preemptions\n",
      static_cast<long long>(st.preempted_swap),
      static_cast<long long>(st.preempted_recompute));
}

// Prefix caching with a host tier under CP: a prompt's cached blocks,
// evicted by a longer one, spill to the host (each to its own rank) and
// are hit from there by the same prompt again (192 of its 200 tokens),
// with CP 1's tokens and logprobs.
TEST(ContextParallelTest, SpilledPrefixBlocksStillHitUnderCp) {
  const ModelConfig c = RandomConfig();
  auto source = RandomLlamaWeights(c, 10);
  const std::vector<GenerateRequest> reqs = {
      Requests({Prompt(200, 1, 311)}, 4)[0],
      Requests({Prompt(300, 2, 311)}, 4)[0],  // Evicts the first.
      Requests({Prompt(200, 1, 311)}, 4)[0]};
  auto base = RunLayout(*source, {1, 1, 1}, reqs, 64);
  ASSERT_TRUE(base.ok()) << base.status();
  for (const Layout& l : {Layout{1, 1, 2}, Layout{2, 1, 2}}) {
    SCOPED_TRACE(Name(l));
    EngineLeakCheck engines;
    Engine* e = engines.Keep(CreateLocalEngine(
        *source, {.kv = {.kv_cache_bytes = 12 * BlockBytes(c) / l.tp,
                         .cpu_offload_bytes = 20 * BlockBytes(c) / l.tp,
                         .dtype = DType::kF32},
                  .limits = {.max_batched_tokens = 64},
                  .threads = 1,
                  .tp = l.tp,
                  .cp = l.cp}));
    ASSERT_NE(e, nullptr);
    ASSERT_TRUE(e->blocks().prefix_caching());
    for (size_t i = 0; i < reqs.size(); ++i) {
      const SchedulerStats before = e->stats();
      auto got = e->Generate(reqs[i]);
      ASSERT_TRUE(got.ok()) << got.status();
      ExpectSame({*got}, {(*base)[i]}, 1e-4);
      if (i == 2) {
        EXPECT_EQ(e->stats().blocks.prefix_hit_tokens -
                      before.blocks.prefix_hit_tokens,
                  192);  // 12 full blocks, back from the host.
      }
    }
    EXPECT_GT(e->stats().blocks.spilled, 0);
    EXPECT_EQ(e->blocks().used_blocks(), 0);
  }
}

// A lone sequence larger than the device, after other prompts left cached
// blocks of uneven ranks on both tiers: new blocks may come from any rank
// (evicting cached ones), its older blocks move to the host of their own
// rank, and it still runs to the end with CP 1's tokens, at CP 2 (4 + 3
// blocks per rank: exactly the 14 blocks of its 220 tokens) and CP 3.
TEST(ContextParallelTest, LoneSequenceThroughTheHostAfterCachedBlocks) {
  const ModelConfig c = RandomConfig();
  auto source = RandomLlamaWeights(c, 12);
  const std::vector<GenerateRequest> reqs = {
      Requests({Prompt(50, 3, 311)}, 2)[0],
      Requests({Prompt(23, 4, 311)}, 2)[0],
      Requests({Prompt(190, 5, 311)}, 30)[0]};
  auto base = RunLayout(*source, {1, 1, 1}, reqs, 32);
  ASSERT_TRUE(base.ok()) << base.status();
  for (const int cp : {2, 3}) {
    SCOPED_TRACE(cp);
    EngineLeakCheck engines;
    Engine* e = engines.Keep(CreateLocalEngine(
        *source, {.kv = {.kv_cache_bytes = 4 * BlockBytes(c),
                         .cpu_offload_bytes = 3 * BlockBytes(c),
                         .dtype = DType::kF32},
                  .limits = {.max_batched_tokens = 32},
                  .threads = 1,
                  .cp = cp}));
    ASSERT_NE(e, nullptr);
    for (size_t i = 0; i < reqs.size(); ++i) {
      auto got = e->Generate(reqs[i]);
      ASSERT_TRUE(got.ok()) << got.status();
      ExpectSame({*got}, {(*base)[i]}, 1e-4);
    }
    EXPECT_GT(e->stats().offloaded, 0);
    EXPECT_EQ(e->blocks().used_blocks(), 0);
  }
}

// The capacity test with the host tier counted: a rank's pool of 4 device
// + 4 host blocks cannot hold 150 + 20 tokens (11 blocks): refused at CP =
// 1 with the numbers; at CP = 2 the group holds 8 + 8 and the lone
// sequence runs through both ranks' host tiers (its older blocks offloaded,
// each to its own rank) with the tokens of CP = 1 given twice the pool.
TEST(ContextParallelTest, CapacityWithAHostTierGrowsWithCp) {
  const ModelConfig c = RandomConfig();
  auto source = RandomLlamaWeights(c, 5);
  const int64_t block_bytes = BlockBytes(c);
  const std::vector<GenerateRequest> reqs = Requests({Prompt(150, 1, 311)}, 20);
  auto small = RunLayout(*source, {1, 1, 1}, reqs, 32, 4 * block_bytes, nullptr,
                         4 * block_bytes);
  EXPECT_TRUE(testing_util::IsError(
      small, absl::StatusCode::kInvalidArgument,
      "170 tokens need 11 KV blocks of 16 tokens but the cache holds 8 (4 "
      "device + 4 host)"));
  int64_t blocks = 0;
  auto twice =
      RunLayout(*source, {1, 1, 1}, reqs, 32, 16 * block_bytes, &blocks);
  ASSERT_TRUE(twice.ok()) << twice.status();
  EXPECT_EQ(blocks, 16);
  for (const Layout& l : {Layout{1, 1, 2}, Layout{2, 1, 2}}) {
    SCOPED_TRACE(Name(l));
    SchedulerStats st;
    auto cp = RunLayout(*source, l, reqs, 32, 4 * block_bytes / l.tp, &blocks,
                        4 * block_bytes / l.tp, &st);
    ASSERT_TRUE(cp.ok()) << cp.status();
    EXPECT_EQ(blocks, 8);  // Two ranks of 4 device blocks.
    ExpectSame(*cp, *twice, 1e-4);
    EXPECT_GT(st.offloaded, 0) << "the host tier held part of the sequence";
    EXPECT_EQ(st.device.used + st.host.used, 0);
  }
  // And CP = 2 has a limit too, stated per rank with both tiers.
  auto too_long =
      RunLayout(*source, {1, 1, 2}, Requests({Prompt(300, 2, 311)}, 20), 32,
                4 * block_bytes, nullptr, 4 * block_bytes);
  EXPECT_TRUE(testing_util::IsError(
      too_long, absl::StatusCode::kInvalidArgument,
      "the cache holds 16 (8 device + 8 host over 2 CP ranks, 8 each)"));
}

// Sequence parallel: a step of n >= C tokens runs only its slice through
// each CP rank's projections and MLP, tokens [c n / C, (c + 1) n / C) on
// CP rank c (every TP and PP rank of it alike), so prefill compute is
// divided; a lone sequence's decode step (one token, fewer than C) runs
// on every rank. Counted by the runners, not timed.
TEST(ContextParallelTest, PrefillTokensAreSplitOverCpRanks) {
  auto source = RandomLlamaWeights(RandomConfig(), 3);
  // One 70-token prefill step (it samples the first token), then two
  // decode steps of one token.
  const std::vector<GenerateRequest> reqs = Requests({Prompt(70, 1, 311)}, 3);
  for (const Layout& l :
       {Layout{1, 1, 1}, Layout{1, 1, 2}, Layout{1, 1, 3}, Layout{2, 2, 2}}) {
    SCOPED_TRACE(Name(l));
    EngineLeakCheck engines;
    auto engine =
        CreateLocalEngine(*source, {.kv = {.dtype = DType::kF32},
                                    .limits = {.max_batched_tokens = 512},
                                    .threads = 1,
                                    .tp = l.tp,
                                    .pp = l.pp,
                                    .cp = l.cp});
    ASSERT_TRUE(engine.ok()) << engine.status();
    Engine* e = engines.Keep(std::move(engine));
    const std::vector<RunnerStats> before = e->executor().RankStats();
    auto got = e->GenerateBatch(reqs);
    ASSERT_TRUE(got.ok()) << got.status();
    const std::vector<RunnerStats> after = e->executor().RankStats();
    ASSERT_EQ(after.size(), static_cast<size_t>(l.tp * l.pp * l.cp));
    ASSERT_EQ(before.size(), after.size());
    for (size_t r = 0; r < after.size(); ++r) {
      // Rank index (pp * cp + cp_rank) * tp + tp_rank.
      const int64_t c = (static_cast<int64_t>(r) / l.tp) % l.cp;
      const int64_t slice = (c + 1) * 70 / l.cp - c * 70 / l.cp;
      EXPECT_EQ(after[r].steps - before[r].steps, 3) << "rank " << r;
      EXPECT_EQ(after[r].token_rows - before[r].token_rows, slice + 2)
          << "rank " << r;
    }
  }
}

TEST(ContextParallelTest, RefusesWhatIsNotBuilt) {
  auto source = RandomLlamaWeights(RandomConfig(), 3);
  EXPECT_TRUE(testing_util::IsError(CreateLocalEngine(*source, {.cp = 0}),
                                    absl::StatusCode::kInvalidArgument,
                                    "--cp must be >= 1"));
  EXPECT_TRUE(testing_util::IsError(
      CreateLocalEngine(*source, {.cp = 2, .device = DeviceKind::kCuda}),
      absl::StatusCode::kUnimplemented, "on CUDA"));
}

}  // namespace
}  // namespace shardlm
