// The control plane end to end in one process (cluster_test_util.h): TP x
// PP clusters give the tokens of an in-process TP = PP = 1 engine, KV tiers
// and prefix hits work across it, and what crosses it is what it should
// be. Failures, startup and TLS are in cluster_{failure,startup,tls}_test.cc.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>
#include <tuple>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "cluster/cluster_test_util.h"
#include "cluster/remote_executor.h"
#include "core/max_abs_diff.h"
#include "core/status.h"
#include "executor/local_engine.h"
#include "gtest/gtest.h"
#include "kernels/threading.h"
#include "model/in_memory_weights.h"
#include "step/step_codec.h"

namespace shardlm {
namespace {

using cluster_testing::Options;
using cluster_testing::RandomConfig;
using cluster_testing::Requests;
using cluster_testing::TestCluster;

TEST(BlockTableDeltasTest, SendsOnlyNewBlocks) {
  BlockTableDeltas d;
  std::vector<int32_t> delta;
  int32_t keep = 0;
  d.Delta(7, {3, 4}, &delta, &keep);
  EXPECT_EQ(delta, (std::vector<int32_t>{3, 4}));
  EXPECT_EQ(keep, -1);
  d.Delta(7, {3, 4}, &delta, &keep);
  EXPECT_TRUE(delta.empty());
  EXPECT_EQ(keep, -1);
  d.Delta(7, {3, 4, 9}, &delta, &keep);
  EXPECT_EQ(delta, (std::vector<int32_t>{9}));
  // Shrunk (rejected drafts rolled back), then grown with another block:
  // the first two kept, 6 appended; and shrunk alone.
  d.Delta(7, {3, 4, 6}, &delta, &keep);
  EXPECT_EQ(delta, (std::vector<int32_t>{6}));
  EXPECT_EQ(keep, 2);
  d.Delta(7, {3}, &delta, &keep);
  EXPECT_TRUE(delta.empty());
  EXPECT_EQ(keep, 1);
  d.Delta(7, {5}, &delta, &keep);
  EXPECT_EQ(delta, (std::vector<int32_t>{5}));
  EXPECT_EQ(keep, 0);
  EXPECT_TRUE(d.TakeReleased().empty());
  d.Release(7);
  d.Release(8);  // Never sent: nothing to tell the workers.
  EXPECT_EQ(d.TakeReleased(), (std::vector<int64_t>{7}));
  EXPECT_EQ(d.tracked(), 0u);
  d.Delta(7, {5}, &delta, &keep);
  EXPECT_EQ(delta, (std::vector<int32_t>{5}));
}

// The workers' mirror follows: a delta that keeps part of a table.
TEST(BlockTableDeltasTest, WorkersApplyTheBlocksKept) {
  BlockTableDeltas sent;
  BlockTableMirror mirror;
  for (const std::vector<int32_t>& table :
       std::vector<std::vector<int32_t>>{{1, 2, 3}, {1, 2}, {1, 2, 8, 9}}) {
    StepInput step{.tokens = {0},
                   .positions = {0},
                   .token_seq = {0},
                   .block_tables = {table},
                   .seq_ids = {4}};
    v1::StepPlan plan;
    ASSERT_TRUE(EncodeStepPlan(step, 1, sent, &plan).ok());
    const StepInput got = DecodeStepPlan(plan, mirror);
    EXPECT_EQ(got.block_tables, std::vector<std::vector<int32_t>>{table});
  }
}

TEST(ModelDigestTest, CatchesDifferentFiles) {
  const auto dir = std::filesystem::temp_directory_path() /
                   absl::StrCat("shardlm_digest_", getpid());
  std::filesystem::create_directories(dir);
  const auto write = [](const std::filesystem::path& p, size_t n, char last) {
    std::ofstream out(p, std::ios::binary);
    std::string s(n, 'x');
    s.back() = last;
    out << s;
  };
  write(dir / "a.gguf", 3 << 20, 'a');
  uint64_t bytes = 0;
  auto d1 = ModelDigest((dir / "a.gguf").string(), &bytes);
  ASSERT_TRUE(d1.ok()) << d1.status();
  EXPECT_EQ(bytes, 3u << 20);
  write(dir / "a.gguf", 3 << 20, 'b');  // Same size, last byte differs.
  auto d2 = ModelDigest((dir / "a.gguf").string(), &bytes);
  ASSERT_TRUE(d2.ok());
  EXPECT_NE(*d1, *d2);
  write(dir / "model.safetensors", 100, 'c');
  write(dir / "config.json", 10, '}');
  auto d3 = ModelDigest(dir.string(), &bytes);
  ASSERT_TRUE(d3.ok()) << d3.status();
  EXPECT_EQ(bytes, 110u);  // The .gguf is not part of a safetensors model.
  auto missing = ModelDigest((dir / "nope").string(), &bytes);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(missing.status().message(), "nope"));
  std::filesystem::remove_all(dir);
}

// Workers of every layout (tp x pp x cp of them, numbered as in-process)
// give the tokens and logprobs of TP = PP = CP = 1 in one process. Under
// CP the coordinator's block manager holds the group's blocks (cp x one
// worker's) and the 12 requests' tables interleave over the CP ranks (the
// longest prompts span 4+ blocks), so every rank attends part of every
// long row.
struct Layout {
  int tp = 1, pp = 1, cp = 1;
  PpBalance balance = PpBalance::kDecode;
};

class ClusterEquivalenceTest : public ::testing::TestWithParam<Layout> {};

TEST_P(ClusterEquivalenceTest, SameTokensAsOneProcess) {
  const auto [tp, pp, cp, balance] = GetParam();
  auto source = RandomLlamaWeights(RandomConfig(), 3);
  const std::vector<GenerateRequest> reqs = Requests(12);
  // f32 KV on both sides, so that the bound is f32's reordering (1e-6
  // here) with room to spare: f16 KV adds rounding steps that the machine's
  // BLAS summation order decides (parallel_equivalence_test bounds those),
  // and its 1e-4 moves are no sign of a wrong cluster. The swap test below
  // runs the cluster on the default f16.
  EngineLeakCheck base_engines;
  Engine* base_engine = base_engines.Keep(
      CreateLocalEngine(*source, {.kv = {.dtype = DType::kF32},
                                  .limits = {.max_batched_tokens = 13},
                                  .threads = 1}));
  ASSERT_NE(base_engine, nullptr);
  auto base = base_engine->GenerateBatch(reqs);
  ASSERT_TRUE(base.ok()) << base.status();

  ClusterOptions options = Options(tp, pp);
  options.cp = cp;
  options.pp_balance = balance;
  options.kv.dtype = DType::kF32;
  TestCluster cluster(*source, options);
  cluster.StartAll();
  auto executor = RemoteExecutor::WaitForWorkers(
      cluster.service(), source->config(), absl::Seconds(30));
  ASSERT_TRUE(executor.ok()) << executor.status();
  const RemoteExecutor* remote = executor->get();
  EXPECT_EQ(remote->num_kv_blocks(), cp * 512 / 16);
  EXPECT_TRUE(remote->Health().ok()) << remote->Health();
  for (int r = 1; r <= tp * pp * cp; ++r) {
    const WorkerAssignment& a = cluster.host(r).assignment;
    EXPECT_EQ(a.cp, cp);
    EXPECT_EQ(a.pp_balance, balance);
    EXPECT_EQ(
        RankIndex(
            {.tp_rank = a.tp_rank, .cp_rank = a.cp_rank, .pp_rank = a.pp_rank},
            tp, cp),
        r - 1);
  }
  Engine* engine = cluster.Keep(Engine::Create(
      std::move(*executor), {.limits = {.max_batched_tokens = 13}, .cp = cp}));
  ASSERT_NE(engine, nullptr);
  EXPECT_EQ(engine->blocks().interleave(), cp);
  auto got = engine->GenerateBatch(reqs);
  ASSERT_TRUE(got.ok()) << got.status();
  int64_t blocks = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ((*got)[i].tokens, (*base)[i].tokens) << "request " << i;
    ASSERT_EQ((*got)[i].prompt_logits.size(), (*base)[i].prompt_logits.size());
    const double err =
        MaxAbsDiff((*got)[i].prompt_logits, (*base)[i].prompt_logits);
    EXPECT_LT(err, 1e-4) << "request " << i;
    // Log-probabilities cross the control plane row by row.
    ASSERT_EQ((*got)[i].logprobs.size(), (*base)[i].logprobs.size());
    EXPECT_EQ((*got)[i].logprobs.size(),
              reqs[i].logprobs > 0 ? (*got)[i].tokens.size() : 0u);
    for (size_t t = 0; t < (*base)[i].logprobs.size(); ++t) {
      const TokenLogprobs& a = (*got)[i].logprobs[t];
      const TokenLogprobs& b = (*base)[i].logprobs[t];
      EXPECT_NEAR(a.sampled, b.sampled, 1e-4) << "request " << i;
      ASSERT_EQ(a.top.size(), static_cast<size_t>(reqs[i].logprobs));
      ASSERT_EQ(a.top.size(), b.top.size());
      for (size_t k = 0; k < a.top.size(); ++k) {
        EXPECT_EQ(a.top[k].token, b.top[k].token) << "request " << i;
        EXPECT_NEAR(a.top[k].logprob, b.top[k].logprob, 1e-4);
      }
    }
    // Blocks are taken as the KV grows: the last token's is never computed.
    blocks += (reqs[i].prompt.size() + (*got)[i].tokens.size() - 1 + 15) / 16;
  }
  EXPECT_EQ(engine->blocks().used_blocks(), 0);
  // Every block id went out once: plans carry deltas, not whole tables.
  const RemoteExecutorStats stats = remote->stats();
  EXPECT_EQ(stats.blocks_sent, blocks);
  EXPECT_GT(stats.steps, 12);
  std::printf("[tp%d pp%d cp%d] %lld steps, %lld block ids, %lld plan bytes\n",
              tp, pp, cp, static_cast<long long>(stats.steps),
              static_cast<long long>(stats.blocks_sent),
              static_cast<long long>(stats.plan_bytes));
  // A second batch reuses the workers' tables cleanly.
  auto again = engine->GenerateBatch({reqs[3]});
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ((*again)[0].tokens, (*base)[3].tokens);
  EXPECT_EQ(engine->blocks().used_blocks(), 0);
  for (const absl::Status& s : cluster.Stop()) EXPECT_TRUE(s.ok()) << s;
}

// Speculative decoding over the control plane (TP 2 x PP 2 workers): the
// verification rows, and the block tables that shrink when drafts are
// rejected, cross it; the tokens are those of one process without
// speculation. Prompts that repeat themselves, so that prompt lookup
// drafts (1-grams too).
TEST(ClusterSpeculationTest, SameTokensAsOneProcessWithoutIt) {
  auto source = RandomLlamaWeights(RandomConfig(), 3);
  std::vector<GenerateRequest> reqs;
  for (int i = 0; i < 4; ++i) {
    std::vector<int32_t> p = cluster_testing::Prompt(6 + i, i, 311);
    for (int r = 0; r < 3; ++r) p.insert(p.end(), p.begin(), p.begin() + 6);
    reqs.push_back({.prompt = p, .max_tokens = 24});
  }
  EngineLeakCheck base_engines;
  Engine* base_engine =
      base_engines.Keep(CreateLocalEngine(*source, {.batch_invariant = true}));
  ASSERT_NE(base_engine, nullptr);
  auto base = base_engine->GenerateBatch(reqs);
  ASSERT_TRUE(base.ok()) << base.status();

  ClusterOptions options = Options(2, 2);
  options.batch_invariant = true;
  TestCluster cluster(*source, options);
  cluster.StartAll();
  auto executor = RemoteExecutor::WaitForWorkers(
      cluster.service(), source->config(), absl::Seconds(30));
  ASSERT_TRUE(executor.ok()) << executor.status();
  EXPECT_TRUE(cluster.host(1).assignment.batch_invariant);
  Engine* engine = cluster.Keep(Engine::Create(
      std::move(*executor),
      {.speculation = {.method = SpeculationOptions::Method::kNgram,
                       .adaptive = false,
                       .ngram_min = 1}}));
  ASSERT_NE(engine, nullptr);
  auto got = engine->GenerateBatch(reqs);
  ASSERT_TRUE(got.ok()) << got.status();
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ((*got)[i].tokens, (*base)[i].tokens) << "request " << i;
  }
  const SchedulerStats s = engine->stats();
  EXPECT_GT(s.spec_accepted, 0);
  EXPECT_GT(s.spec_drafted, s.spec_accepted);
  EXPECT_EQ(engine->blocks().used_blocks(), 0);
  for (const absl::Status& st : cluster.Stop()) EXPECT_TRUE(st.ok()) << st;
}

// Swaps to the host tier, cached-prefix hits and spills are block copies in
// the plans; every worker runs them on its own slice.
TEST(ClusterKvTiersTest, SwapsAndPrefixHitsCrossTheControlPlane) {
  auto source = RandomLlamaWeights(RandomConfig(), 3);
  const std::vector<GenerateRequest> reqs = Requests(24);
  EngineLeakCheck base_engines;
  Engine* base_engine = base_engines.Keep(
      CreateLocalEngine(*source, {.kv = {.prefix_caching = false},
                                  .limits = {.max_batched_tokens = 13},
                                  .threads = 1}));
  ASSERT_NE(base_engine, nullptr);
  auto base = base_engine->GenerateBatch(reqs);
  ASSERT_TRUE(base.ok()) << base.status();

  // One block of a shard at TP=2 x PP=2: K and V, 2 layers, 16 tokens, 2 KV
  // heads of 8 values, f16 (the default KV dtype).
  constexpr int64_t kShardBlock = 2 * 2 * 16 * 2 * 8 * 2;
  ClusterOptions options = Options(2, 2);
  options.kv.kv_cache_bytes = 8 * kShardBlock;
  options.kv.cpu_offload_bytes = 60 * kShardBlock;
  TestCluster cluster(*source, options);
  cluster.StartAll();
  auto executor = RemoteExecutor::WaitForWorkers(
      cluster.service(), source->config(), absl::Seconds(30));
  ASSERT_TRUE(executor.ok()) << executor.status();
  EXPECT_EQ((*executor)->num_kv_blocks(), 8);
  EXPECT_EQ((*executor)->num_host_kv_blocks(), 60);
  Engine* engine = cluster.Keep(Engine::Create(
      std::move(*executor), {.limits = {.max_batched_tokens = 13}}));
  ASSERT_NE(engine, nullptr);
  auto got = engine->GenerateBatch(reqs);
  ASSERT_TRUE(got.ok()) << got.status();
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ((*got)[i].tokens, (*base)[i].tokens) << "request " << i;
  }
  // The longest prompt again: its full blocks are cached (on either tier).
  const SchedulerStats before = engine->stats();
  auto again = engine->GenerateBatch({reqs[7]});
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ((*again)[0].tokens, (*base)[7].tokens);
  const SchedulerStats after = engine->stats();
  EXPECT_GT(before.preempted_swap, 0);
  EXPECT_EQ(after.blocks.prefix_hit_tokens - before.blocks.prefix_hit_tokens,
            (reqs[7].prompt.size() - 1) / 16 * 16);
  EXPECT_EQ(engine->blocks().used_blocks(), 0);
  std::printf(
      "cluster tp2 pp2, 8 device blocks: %lld swap preemptions, %lld "
      "blocks out, %lld in, %lld spilled\n",
      static_cast<long long>(after.preempted_swap),
      static_cast<long long>(after.blocks.swapped_out),
      static_cast<long long>(after.blocks.swapped_in),
      static_cast<long long>(after.blocks.spilled));
  for (const absl::Status& s : cluster.Stop()) EXPECT_TRUE(s.ok()) << s;
}

// The name of a layout: "tp2_pp2", with "_cp2" when cp > 1.
// The name of a layout: "tp2_pp2", with "_cp2" when cp > 1 and
// "_prefill" for --pp-balance prefill.
std::string LayoutName(const ::testing::TestParamInfo<Layout>& info) {
  const Layout& l = info.param;
  return absl::StrCat("tp", l.tp, "_pp", l.pp,
                      l.cp > 1 ? absl::StrCat("_cp", l.cp) : "",
                      l.balance == PpBalance::kPrefill ? "_prefill" : "");
}

// --pp-balance prefill reaches every worker's assignment (each plans its
// layers from it; worker/shard_test checks the boundaries it gives).
INSTANTIATE_TEST_SUITE_P(
    Layouts, ClusterEquivalenceTest,
    ::testing::Values(Layout{1, 1, 1}, Layout{2, 1, 1}, Layout{1, 2, 1},
                      Layout{2, 2, 1}, Layout{1, 1, 2}, Layout{2, 2, 2},
                      Layout{1, 2, 1, PpBalance::kPrefill}),
    LayoutName);

}  // namespace
}  // namespace shardlm
