// Hybrid models (Qwen3.5's layer pattern: Gated DeltaNet layers and a
// gated attention layer) through the engine: a sequence's recurrent state
// lives in its slot, so its tokens do not depend on which other sequences
// share its steps, how its prompt was chunked, whether it was preempted
// (and recomputed), or how the model is split over TP and PP ranks. Every
// test compares with each request run alone, unchunked, on TP = PP = 1.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/max_abs_diff.h"
#include "engine/engine.h"
#include "executor/local_engine.h"
#include "executor/scheduler_test_util.h"
#include "gtest/gtest.h"
#include "model/in_memory_weights.h"
#include "worker/kv_pool.h"
#include "worker/llama_weights.h"

namespace shardlm {
namespace {

// Four layers, the last attending (6 query and 3 KV heads, gated,
// QK-normed, RoPE over 8 of 16 dimensions); 2 key heads of 16 serving 4
// value heads of 16, tiled as llama.cpp writes them.
ModelConfig HybridConfig() {
  ModelConfig c = TinyConfig(512);
  c.architecture = "qwen35";
  c.n_kv_heads = 3;
  c.n_layers = 4;
  c.linear_layers = {true, true, true, false};
  c.ssm_conv_width = 4;
  c.ssm_k_heads = 2;
  c.ssm_k_dim = 16;
  c.ssm_v_heads = 4;
  c.ssm_v_dim = 16;
  c.ssm_v_tiled = true;
  c.attention_gate = true;
  c.qk_norm = true;
  c.rope_dims = 8;
  return c;
}

class HybridTest : public ::testing::Test {
 protected:
  HybridTest() : source_(RandomLlamaWeights(HybridConfig(), 17)) {}
  void TearDown() override { engines_.Close(); }
  Engine* MakeEngine(EngineOptions options) {
    options.threads = 1;
    options.kv.dtype = DType::kF32;
    return engines_.Keep(CreateLocalEngine(*source_, options));
  }
  // Each request alone, its prompt in one step.
  std::vector<GenerateResult> Alone(const std::vector<GenerateRequest>& reqs) {
    Engine* engine = MakeEngine({.kv = {.prefix_caching = false},
                                 .limits = {.max_batched_tokens = 512}});
    std::vector<GenerateResult> out;
    for (const auto& r : reqs) {
      auto got = engine->Generate(r);
      EXPECT_TRUE(got.ok()) << got.status();
      out.push_back(got.ok() ? *got : GenerateResult{});
    }
    return out;
  }
  static std::vector<GenerateRequest> Requests(int n) {
    std::vector<GenerateRequest> reqs;
    for (int i = 0; i < n; ++i) {
      reqs.push_back({.prompt = Prompt(5 + (i * 23) % 60, i),
                      .max_tokens = 12 + i % 5,
                      .return_prompt_logits = true});
    }
    return reqs;
  }
  void ExpectSame(const std::vector<GenerateResult>& got,
                  const std::vector<GenerateResult>& want) {
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].tokens, want[i].tokens) << "request " << i;
      // Other rows in a GEMM, or other chunks, sum in another order.
      EXPECT_LT(MaxAbsDiff(got[i].prompt_logits, want[i].prompt_logits), 1e-4)
          << "request " << i;
    }
  }
  std::unique_ptr<InMemoryWeights> source_;
  EngineLeakCheck engines_;
};

// Eight sequences in the same steps, prompts chunked by 13 tokens (so
// chunks of several sequences share a step): each as if alone.
TEST_F(HybridTest, BatchedAndChunkedSequencesEqualEachAlone) {
  const auto reqs = Requests(8);
  const auto alone = Alone(reqs);
  Engine* engine = MakeEngine({.limits = {.max_batched_tokens = 13}});
  ASSERT_NE(engine, nullptr);
  auto got = engine->GenerateBatch(reqs);
  ASSERT_TRUE(got.ok()) << got.status();
  ExpectSame(*got, alone);
  EXPECT_EQ(engine->blocks().FreeStateSlots(), engine->blocks().state_slots());
}

// A KV budget of a few blocks beside the state slots: sequences are
// preempted (recomputed from position 0: their slot goes back with their
// blocks) and resumed, and still give what each gives alone.
TEST_F(HybridTest, PreemptedSequencesEqualEachAlone) {
  const auto reqs = Requests(8);
  const auto alone = Alone(reqs);
  const ModelConfig& c = source_->config();
  const KvPoolConfig shape = PoolShapeForShard(c, WholeModelSpec(c));
  ASSERT_EQ(shape.n_layers, 1);  // KV for the attending layer only.
  ASSERT_EQ(shape.linear_layers, 3);
  KvPoolConfig sized = shape;
  sized.block_size = 16;
  sized.dtype = DType::kF32;
  sized.state_slots = 4;
  const int64_t budget = sized.StateBytes() + 9 * sized.BytesPerBlock();
  Engine* engine =
      MakeEngine({.kv = {.kv_cache_bytes = budget, .prefix_caching = false},
                  .limits = {.max_batched_tokens = 32, .max_seqs = 4}});
  ASSERT_NE(engine, nullptr);
  EXPECT_EQ(engine->blocks().num_blocks(), 9);
  EXPECT_EQ(engine->blocks().state_slots(), 4);
  auto got = engine->GenerateBatch(reqs);
  ASSERT_TRUE(got.ok()) << got.status();
  ExpectSame(*got, alone);
  EXPECT_GT(engine->stats().preempted_recompute, 0);
  EXPECT_EQ(engine->stats().preempted_swap, 0);
  EXPECT_EQ(engine->blocks().used_blocks(), 0);
  EXPECT_EQ(engine->blocks().FreeStateSlots(), 4);
}

// With a host tier, a preempted sequence's state goes to a host slot with
// its blocks and comes back when it resumes: nothing is recomputed, and
// every request still gives what it gives alone.
TEST_F(HybridTest, PreemptedSequencesSwapTheirStateToTheHostAndBack) {
  const auto reqs = Requests(8);
  const auto alone = Alone(reqs);
  const ModelConfig& c = source_->config();
  KvPoolConfig sized = PoolShapeForShard(c, WholeModelSpec(c));
  sized.block_size = 16;
  sized.dtype = DType::kF32;
  sized.state_slots = 4;
  const int64_t device = sized.StateBytes() + 9 * sized.BytesPerBlock();
  const int64_t host = sized.StateBytes() + 64 * sized.BytesPerBlock();
  Engine* engine =
      MakeEngine({.kv = {.kv_cache_bytes = device,
                         .cpu_offload_bytes = host,
                         .prefix_caching = false},
                  .limits = {.max_batched_tokens = 32, .max_seqs = 4}});
  ASSERT_NE(engine, nullptr);
  EXPECT_EQ(engine->blocks().num_host_blocks(), 64);
  EXPECT_EQ(engine->blocks().host_state_slots(), 4);
  auto got = engine->GenerateBatch(reqs);
  ASSERT_TRUE(got.ok()) << got.status();
  ExpectSame(*got, alone);
  const SchedulerStats st = engine->stats();
  EXPECT_GT(st.preempted_swap, 0);
  EXPECT_EQ(st.preempted_recompute, 0) << "the host had room for every swap";
  EXPECT_EQ(st.blocks.states_swapped_out, st.preempted_swap);
  EXPECT_EQ(st.blocks.states_swapped_in, st.blocks.states_swapped_out);
  EXPECT_EQ(engine->blocks().used_blocks(), 0);
  EXPECT_EQ(engine->blocks().FreeStateSlots(), 4);
}

// Prefix caching: a prompt's state at the end of its last full block is
// kept (its prefill chunk stops there). The same prompt again, and a
// conversation that extends it, attach the cached blocks up to there,
// restore the state from the snapshot, compute only the rest, and give
// the tokens of a cold run.
TEST_F(HybridTest, APrefixHitRestoresTheStateAndComputesOnlyTheRest) {
  GenerateRequest first{
      .prompt = Prompt(45, 3), .max_tokens = 10, .return_prompt_logits = true};
  GenerateRequest again = first;
  GenerateRequest longer = first;
  for (int32_t t = 7; t < 21; ++t) longer.prompt.push_back(t);
  const auto cold = Alone({first, longer});
  Engine* engine = MakeEngine({.limits = {.max_batched_tokens = 512}});
  ASSERT_NE(engine, nullptr);
  EXPECT_TRUE(engine->blocks().prefix_caching());
  EXPECT_EQ(engine->blocks().state_snapshots(), 64);
  for (const auto& [req, want, cached] :
       {std::tuple<const GenerateRequest*, const GenerateResult*, int64_t>{
            &first, &cold[0], 0},
        {&again, &cold[0], 32},
        {&longer, &cold[1], 32}}) {
    SCOPED_TRACE(req->prompt.size());
    const int64_t computed_before = engine->stats().computed_tokens;
    auto got = engine->Generate(*req);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->tokens, want->tokens);
    EXPECT_LT(MaxAbsDiff(got->prompt_logits, want->prompt_logits), 1e-4);
    EXPECT_EQ(got->cached_prompt_tokens, cached);
    // Only the rest of the prompt and the generated tokens but the last.
    EXPECT_EQ(engine->stats().computed_tokens - computed_before,
              static_cast<int64_t>(req->prompt.size()) - cached +
                  req->max_tokens - 1);
  }
  EXPECT_EQ(engine->stats().blocks.state_snapshots, 2)
      << "the first prompt's and the longer one's (at 32 and 48 tokens)";
  EXPECT_EQ(engine->blocks().FreeStateSlots(), 64);
}

// TP splits the value heads (2 ranks: 2 and 2; 3 ranks: 1, 1 and 2, a
// share that starts off a key head boundary) and PP the layers (4 stages:
// three of linear layers only, which hold no KV).
TEST_F(HybridTest, EveryLayoutEqualsTpOne) {
  const auto reqs = Requests(4);
  const auto alone = Alone(reqs);
  for (auto [tp, pp] : {std::pair{2, 1}, {3, 1}, {1, 2}, {2, 2}, {1, 4}}) {
    SCOPED_TRACE(absl::StrCat("tp ", tp, " pp ", pp));
    Engine* engine =
        MakeEngine({.limits = {.max_batched_tokens = 13}, .tp = tp, .pp = pp});
    ASSERT_NE(engine, nullptr);
    auto got = engine->GenerateBatch(reqs);
    ASSERT_TRUE(got.ok()) << got.status();
    ExpectSame(*got, alone);
  }
}

TEST_F(HybridTest, ContextParallelIsRefusedByName) {
  auto engine = CreateLocalEngine(*source_, {.threads = 1, .cp = 2});
  ASSERT_FALSE(engine.ok());
  EXPECT_EQ(engine.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(engine.status().message().find("Gated DeltaNet"), std::string::npos)
      << engine.status();
}

}  // namespace
}  // namespace shardlm
