// The shard lifecycle (worker/shard.h): what a shard's budget holds, the
// counts it is given, and which shard samples. Tokens across layouts are
// compared in executor/parallel_equivalence_test.cc.
#include "worker/shard.h"

#include <memory>
#include <thread>
#include <tuple>
#include <vector>

#include "collectives/fake_communicator.h"
#include "gtest/gtest.h"
#include "model/in_memory_weights.h"
#include "testing/status.h"
#include "worker/model_runner.h"
#include "worker/sample_step.h"

namespace shardlm {
namespace {

ModelConfig Config() { return SmallTestConfig(); }

// One sequence's prompt, greedy-sampled at its last token.
StepInput Prompt() {
  StepInput s;
  s.tokens = {5, 17, 42, 8};
  s.positions = {0, 1, 2, 3};
  s.token_seq = {0, 0, 0, 0};
  s.block_tables = {{0}};
  s.seq_ids = {1};
  s.logit_rows = {3};
  s.sampling = {SamplingParams{.temperature = 0}};
  s.sample_index = {0};
  return s;
}

ShardRequest Request(const ShardSpec& spec) {
  return {.spec = spec, .kv = {.block_size = 16}, .name = "test shard"};
}

TEST(ShardTest, ABudgetHoldsWhatItSaysAndTheShardTakesNoMore) {
  auto source = RandomLlamaWeights(Config(), 1);
  ASSERT_OK_AND_ASSIGN(ShardPlan plan, PlanShards(*source, 1, 1));
  ShardRequest r = Request(plan.shards[0]);
  // Layers x KV heads x head_dim x 16 tokens x K and V, in f16.
  const ModelConfig c = Config();
  const int64_t block_bytes =
      c.n_layers * c.n_kv_heads * c.head_dim * 16 * 2 * 2;
  r.kv.kv_cache_bytes = 5 * block_bytes + block_bytes / 2;
  r.kv.cpu_offload_bytes = 3 * block_bytes;
  r.kv.dtype = DType::kF16;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Shard> shard, LoadCpuShard(*source, r));
  ASSERT_OK_AND_ASSIGN(const KvBlockCounts available, shard->BlocksAvailable());
  EXPECT_EQ(available.device, 5);
  EXPECT_EQ(available.host, 3);
  EXPECT_FALSE(shard->initialized());
  EXPECT_EQ(shard->Step(Prompt()).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(shard->InitializeCache({.device = 6, .host = 0}, {}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(shard->InitializeCache({.device = 2, .host = 4}, {}).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_OK(shard->InitializeCache({.device = 2, .host = 1}, {}));
  EXPECT_EQ(shard->blocks().device, 2);
  EXPECT_EQ(shard->blocks().host, 1);
  EXPECT_EQ(shard->InitializeCache({.device = 2, .host = 1}, {}).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(ShardTest, AWholeModelShardSamplesAsItsRunnerDoes) {
  auto source = RandomLlamaWeights(Config(), 2);
  ASSERT_OK_AND_ASSIGN(ShardPlan plan, PlanShards(*source, 1, 1));
  ASSERT_TRUE(plan.shards[0].samples());
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Shard> shard,
                       LoadCpuShard(*source, Request(plan.shards[0])));
  ASSERT_OK(shard->InitializeCache({.device = 4, .host = 0}, {}));
  ASSERT_OK_AND_ASSIGN(StepOutput out, shard->Step(Prompt()));

  // The reference: the runner built by hand, its logits sampled.
  ASSERT_OK_AND_ASSIGN(LlamaWeights w,
                       LoadLlamaWeights(*source, plan.shards[0]));
  ASSERT_OK_AND_ASSIGN(
      KvPoolConfig kv,
      PoolConfigForShard(w.config, plan.shards[0], 16, kDefaultCpuKvDType, 0));
  kv.num_blocks = 4;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<KvPool> pool, KvPool::Create(kv));
  ModelRunner runner(std::move(w), std::move(pool));
  ASSERT_OK_AND_ASSIGN(Tensor logits, runner.Forward(Prompt()));
  ASSERT_OK_AND_ASSIGN(StepOutput want, SampleStep(Prompt(), logits));
  EXPECT_EQ(out.tokens, want.tokens);
  ASSERT_EQ(out.tokens.size(), 1u);
}

// PP's stage boundaries (--pp-balance). Every layer of the random model
// weighs the same, and the head (about 7 layers' weights, not tied) is only
// charged by kDecode. The reference boundary is found by brute force over every
// split of the layers into two stages.
TEST(ShardTest, PpBalanceDecidesWhetherTheHeadCounts) {
  ModelConfig c = Config();
  c.n_layers = 12;
  c.vocab_size = 4096;  // A head of about 7 layers' weights.
  c.tied_embeddings = false;
  auto source = RandomLlamaWeights(c, 5);
  uint64_t layer = 0, head = 0;
  for (const TensorInfo& t : source->tensors()) {
    uint64_t n = 1;
    for (int64_t d : t.shape) n *= static_cast<uint64_t>(d);
    if (t.name.rfind("blk.0.", 0) == 0) layer += n;
    if (t.name == "output.weight" || t.name == "output_norm.weight") {
      head += n;
    }
  }
  ASSERT_GT(layer, 0u);
  ASSERT_GT(head, layer);  // Else the two balances could agree.
  const auto best_split = [&](uint64_t last_extra) {
    int64_t best = 1;
    uint64_t best_cost = UINT64_MAX;
    for (int64_t b = 1; b < c.n_layers; ++b) {
      const uint64_t cost =
          std::max(b * layer, (c.n_layers - b) * layer + last_extra);
      if (cost < best_cost) best = b, best_cost = cost;
    }
    return best;
  };
  ASSERT_OK_AND_ASSIGN(
      ShardPlan decode,
      PlanShards(*source, 1, 2, MoeSharding::kAuto, PpBalance::kDecode));
  ASSERT_OK_AND_ASSIGN(
      ShardPlan prefill,
      PlanShards(*source, 1, 2, MoeSharding::kAuto, PpBalance::kPrefill));
  EXPECT_EQ(decode.at(0, 0).layer_end, best_split(head));
  EXPECT_EQ(prefill.at(0, 0).layer_end, c.n_layers / 2);
  EXPECT_LT(decode.at(1, 0).layer_end - decode.at(1, 0).layer_begin,
            c.n_layers / 2);
  for (const ShardPlan* p : {&decode, &prefill}) {
    EXPECT_EQ(p->at(0, 0).layer_begin, 0);
    EXPECT_EQ(p->at(1, 0).layer_begin, p->at(0, 0).layer_end);
    EXPECT_EQ(p->at(1, 0).layer_end, c.n_layers);
  }
  EXPECT_EQ(ParsePpBalance("prefill").value(), PpBalance::kPrefill);
  EXPECT_EQ(PpBalanceName(PpBalance::kDecode), std::string("decode"));
  const auto bad = ParsePpBalance("both");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("--pp-balance 'both'"),
            std::string::npos);
}

// Worker index (pp_rank * cp + cp_rank) * tp + tp_rank, in-process and in a
// cluster alike: every index has one place and back; at CP 1 it is the TP x
// PP numbering; the sampler is the last stage's CP 0, TP 0 (index 6 of 12
// at TP 2 x CP 3 x PP 2).
TEST(ShardTest, RankPlacesOfATpCpPpLayout) {
  for (const auto& [tp, cp, pp] : {std::tuple{1, 2, 1}, std::tuple{2, 2, 1},
                                   std::tuple{2, 3, 2}, std::tuple{3, 1, 2}}) {
    for (int i = 0; i < tp * cp * pp; ++i) {
      const RankPlace p = PlaceOfRank(i, tp, cp);
      EXPECT_EQ(RankIndex(p, tp, cp), i) << tp << " " << cp << " " << pp;
      EXPECT_LT(p.pp_rank, pp);
      if (cp == 1) {
        EXPECT_EQ(p.pp_rank * tp + p.tp_rank, i);
        EXPECT_EQ(p.cp_rank, 0);
      }
    }
    const RankPlace sampler = PlaceOfRank(SamplingShard(tp, pp, cp), tp, cp);
    EXPECT_EQ(sampler.pp_rank, pp - 1);
    EXPECT_EQ(sampler.tp_rank, 0);
    EXPECT_EQ(sampler.cp_rank, 0);
  }
  EXPECT_EQ(SamplingShard(2, 2, 3), 6);
  EXPECT_EQ(SamplingShard(2, 2), SamplingShard(2, 2, 1));
}

// At TP 2 x PP 2 only the last stage's TP rank 0 returns tokens, and a bad
// sampling part is refused by every shard before any collective (none of
// them waits for a peer that refused).
TEST(ShardTest, OnlyTheSamplingShardReturnsTokensAndAllRefuseABadStep) {
  auto source = RandomLlamaWeights(Config(), 3);
  ASSERT_OK_AND_ASSIGN(ShardPlan plan, PlanShards(*source, 2, 2));
  EXPECT_EQ(SamplingShard(2, 2), 2);
  std::vector<std::unique_ptr<Shard>> shards;
  for (const ShardSpec& spec : plan.shards) {
    EXPECT_EQ(spec.samples(),
              &spec == &plan.shards[SamplingShard(plan.tp, plan.pp)]);
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Shard> s,
                         LoadCpuShard(*source, Request(spec)));
    shards.push_back(std::move(s));
  }
  auto tp0 = MakeFakeGroup(2, "tp 0"), tp1 = MakeFakeGroup(2, "tp 1");
  auto pp0 = MakeFakeGroup(2, "pp 0"), pp1 = MakeFakeGroup(2, "pp 1");
  const ShardComms comms[4] = {{tp0[0].get(), pp0[0].get()},
                               {tp0[1].get(), pp1[0].get()},
                               {tp1[0].get(), pp0[1].get()},
                               {tp1[1].get(), pp1[1].get()}};
  for (int r = 0; r < 4; ++r) {
    ASSERT_OK(shards[r]->InitializeCache({.device = 4, .host = 0}, comms[r]));
  }
  const auto run = [&](const StepInput& step) {
    std::vector<absl::StatusOr<StepOutput>> out(4, StepOutput{});
    std::vector<std::thread> threads;
    for (int r = 0; r < 4; ++r) {
      threads.emplace_back([&, r] { out[r] = shards[r]->Step(step); });
    }
    for (std::thread& t : threads) t.join();
    return out;
  };
  const auto out = run(Prompt());
  for (int r = 0; r < 4; ++r) {
    ASSERT_OK(out[r].status());
    EXPECT_EQ(out[r]->tokens.size(), r == 2 ? 1u : 0u) << "rank " << r;
  }
  StepInput bad = Prompt();
  bad.sampling[0].top_p = 2;
  for (const auto& o : run(bad)) {
    EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument);
  }
}

}  // namespace
}  // namespace shardlm
