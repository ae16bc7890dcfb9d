#include "engine/serving_metrics.h"

#include <map>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "engine/engine.h"
#include "engine/engine_leak_check.h"
#include "executor/local_engine.h"
#include "gtest/gtest.h"
#include "model/in_memory_weights.h"

namespace shardlm {
namespace {

// Series name with labels -> value, from Prometheus text; fails the test on
// a line that is neither a comment nor "series value".
std::map<std::string, double> Parse(const std::string& text) {
  std::map<std::string, double> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const size_t space = line.rfind(' ');
    double v = 0;
    EXPECT_TRUE(space != std::string::npos &&
                absl::SimpleAtod(line.substr(space + 1), &v))
        << line;
    EXPECT_EQ(out.count(line.substr(0, space)), 0u) << "repeated: " << line;
    out[line.substr(0, space)] = v;
  }
  return out;
}

TEST(HistogramTest, BucketsAreCumulativeAndInclusive) {
  Histogram h({0.1, 1.0});
  for (double v : {0.05, 0.1, 0.5, 1.0, 7.0}) h.Observe(v);
  const Histogram::Snapshot s = h.Read();
  EXPECT_EQ(s.cumulative, (std::vector<uint64_t>{2, 4, 5}));
  EXPECT_EQ(s.count, 5u);
  EXPECT_DOUBLE_EQ(s.sum, 8.65);
  std::string text;
  h.AppendPrometheus(text, "x_seconds", "help");
  auto m = Parse(text);
  EXPECT_EQ(m["x_seconds_bucket{le=\"0.1\"}"], 2);
  EXPECT_EQ(m["x_seconds_bucket{le=\"1\"}"], 4);
  EXPECT_EQ(m["x_seconds_bucket{le=\"+Inf\"}"], 5);
  EXPECT_EQ(m["x_seconds_count"], 5);
  EXPECT_DOUBLE_EQ(m["x_seconds_sum"], 8.65);
  EXPECT_NE(text.find("# TYPE x_seconds histogram"), std::string::npos);
}

TEST(HistogramTest, LatencyBucketsSpanOneMillisecondToAMinute) {
  const std::vector<double>& b = LatencyBuckets();
  EXPECT_EQ(b.front(), 0.001);
  EXPECT_EQ(b.back(), 60.0);
  EXPECT_TRUE(std::is_sorted(b.begin(), b.end()));
}

TEST(RankMetricsTest, ComputeSecondsAreStepLessCommunicationByStage) {
  // TP=2 x PP=2: ranks 1-2 are stage 0, ranks 3-4 stage 1.
  std::vector<RankReport> ranks;
  for (int r = 1; r <= 4; ++r) {
    ranks.push_back({.rank = r,
                     .stats = {.steps = 10,
                               .forward_seconds = 2.0 * r,
                               .comm_seconds = 0.5 * r}});
  }
  std::string out;
  AppendRankMetrics(out, ranks, /*tp=*/2);
  for (const char* want :
       {"shardlm_rank_compute_seconds_total{rank=\"1\",stage=\"0\"} 1.5\n",
        "shardlm_rank_compute_seconds_total{rank=\"2\",stage=\"0\"} 3\n",
        "shardlm_rank_compute_seconds_total{rank=\"3\",stage=\"1\"} 4.5\n",
        "shardlm_rank_compute_seconds_total{rank=\"4\",stage=\"1\"} 6\n"}) {
    EXPECT_NE(out.find(want), std::string::npos) << want << " in\n" << out;
  }
}

TEST(ServingMetricsTest, RecordsLandInTheirSeries) {
  ServingMetrics m;
  m.RequestFinished({.api = RequestApi::kHttp,
                     .outcome = RequestOutcome::kStop,
                     .prompt_tokens = 7,
                     .generated_tokens = 3,
                     .started = 0.002,
                     .first_token = 0.05,
                     .last_token = 0.25,
                     .done = 0.3});
  // Expired while waiting: only the end-to-end time.
  m.RequestFinished({.api = RequestApi::kGrpc,
                     .outcome = RequestOutcome::kDeadline,
                     .prompt_tokens = 4,
                     .done = 2.0});
  m.Refused(RequestApi::kGrpc, Refusal::kQueueFull);
  auto s = Parse(m.Prometheus());
  EXPECT_EQ(s["shardlm_requests_total{api=\"http\",finish_reason=\"stop\"}"],
            1);
  EXPECT_EQ(
      s["shardlm_requests_total{api=\"grpc\",finish_reason=\"deadline\"}"], 1);
  EXPECT_EQ(s["shardlm_requests_total{api=\"grpc\",finish_reason=\"stop\"}"],
            0);
  EXPECT_EQ(s["shardlm_prompt_tokens_total{api=\"http\"}"], 7);
  EXPECT_EQ(s["shardlm_prompt_tokens_total{api=\"grpc\"}"], 4);
  EXPECT_EQ(s["shardlm_generation_tokens_total{api=\"http\"}"], 3);
  EXPECT_EQ(s["shardlm_request_e2e_seconds_count"], 2);
  EXPECT_DOUBLE_EQ(s["shardlm_request_e2e_seconds_sum"], 2.3);
  EXPECT_EQ(s["shardlm_time_to_first_token_seconds_count"], 1);
  EXPECT_DOUBLE_EQ(s["shardlm_time_to_first_token_seconds_sum"], 0.05);
  EXPECT_DOUBLE_EQ(s["shardlm_request_queue_seconds_sum"], 0.002);
  EXPECT_DOUBLE_EQ(s["shardlm_request_prefill_seconds_sum"], 0.048);
  EXPECT_DOUBLE_EQ(s["shardlm_request_decode_seconds_sum"], 0.2);
  EXPECT_EQ(s["shardlm_requests_refused_total{api=\"grpc\",reason=\"queue_"
              "full\"}"],
            1);
  EXPECT_GT(s["shardlm_process_resident_memory_bytes"], 1 << 20);
}

ModelConfig TinyConfig() {
  ModelConfig c;
  c.n_layers = 2;
  c.hidden = 64;
  c.ffn_hidden = 128;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 16;
  c.vocab_size = 211;
  c.context_length = 128;
  c.rope_theta = 10000.0f;
  c.rope_style = RopeStyle::kRotateHalf;
  return c;
}

// A known workload through the engine: every count is exact, and the
// histograms agree with each other.
TEST(ServingMetricsTest, EngineWorkloadIsCountedExactly) {
  auto source = RandomLlamaWeights(TinyConfig(), 5);
  EngineLeakCheck engines;
  Engine* engine = engines.Keep(CreateLocalEngine(*source, {.threads = 1}));
  ASSERT_NE(engine, nullptr);
  std::vector<GenerateRequest> batch;
  int64_t prompt_tokens = 0;
  for (int i = 0; i < 4; ++i) {
    GenerateRequest r{.prompt = std::vector<int32_t>(3 + 5 * i, 7 + i),
                      .max_tokens = 2 + i};
    r.api = RequestApi::kGrpc;
    prompt_tokens += static_cast<int64_t>(r.prompt.size());
    batch.push_back(r);
  }
  auto results = engine->GenerateBatch(batch);
  ASSERT_TRUE(results.ok()) << results.status();
  // One cancelled after its first token.
  auto cancelled = engine->Generate(
      {.prompt = {1, 2, 3}, .max_tokens = 10, .api = RequestApi::kHttp},
      [](int32_t) { return false; });
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  // One refused: it can never fit the context.
  auto refused = engine->Generate({.prompt = std::vector<int32_t>(200, 1),
                                   .max_tokens = 4,
                                   .api = RequestApi::kHttp});
  EXPECT_FALSE(refused.ok());

  auto s = Parse(engine->metrics().Prometheus());
  EXPECT_EQ(s["shardlm_requests_total{api=\"grpc\",finish_reason=\"length\"}"],
            4);
  EXPECT_EQ(
      s["shardlm_requests_total{api=\"http\",finish_reason=\"cancelled\"}"], 1);
  EXPECT_EQ(
      s["shardlm_requests_refused_total{api=\"http\",reason=\"invalid\"}"], 1);
  EXPECT_EQ(s["shardlm_prompt_tokens_total{api=\"grpc\"}"], prompt_tokens);
  EXPECT_EQ(s["shardlm_generation_tokens_total{api=\"grpc\"}"], 2 + 3 + 4 + 5);
  EXPECT_EQ(s["shardlm_generation_tokens_total{api=\"http\"}"], 1);
  // Every finished request has an end, a queue time and a first token; a
  // request of n tokens has n - 1 gaps.
  EXPECT_EQ(s["shardlm_request_e2e_seconds_count"], 5);
  EXPECT_EQ(s["shardlm_request_queue_seconds_count"], 5);
  EXPECT_EQ(s["shardlm_time_to_first_token_seconds_count"], 5);
  EXPECT_EQ(s["shardlm_inter_token_latency_seconds_count"], 1 + 2 + 3 + 4);
  EXPECT_EQ(s["shardlm_request_e2e_seconds_bucket{le=\"+Inf\"}"], 5);
  // Sums agree: no request's first token comes after its end, and prefill
  // plus queue time is time to first token.
  EXPECT_LE(s["shardlm_time_to_first_token_seconds_sum"],
            s["shardlm_request_e2e_seconds_sum"] + 1e-9);
  EXPECT_NEAR(s["shardlm_request_queue_seconds_sum"] +
                  s["shardlm_request_prefill_seconds_sum"],
              s["shardlm_time_to_first_token_seconds_sum"], 1e-5);
  EXPECT_NEAR(s["shardlm_time_to_first_token_seconds_sum"] +
                  s["shardlm_request_decode_seconds_sum"],
              s["shardlm_request_e2e_seconds_sum"],
              0.05 * s["shardlm_request_e2e_seconds_sum"] + 1e-3);
  EXPECT_EQ(
      engine->metrics().requests(RequestApi::kGrpc, RequestOutcome::kLength),
      4u);
}

// Under CP, shardlm_kv_cp_rank_blocks gives each CP rank's blocks by the
// ids it holds: while a 70-token prompt's first tokens come out, its 5
// blocks alternate over the two ranks (3 on rank 0, 2 on rank 1), each
// rank has its 8 device and 4 host blocks, and the ranks' series sum to
// the group's. Without CP there is no such series.
TEST(ServingMetricsTest, KvBlocksPerCpRank) {
  auto source = RandomLlamaWeights(TinyConfig(), 5);
  // f32 K and V of 2 layers x 2 KV heads x 16, 16 tokens.
  constexpr int64_t kBlock = 2 * 2 * 2 * 16 * 4 * 16;
  for (const int cp : {1, 2}) {
    SCOPED_TRACE(cp);
    EngineLeakCheck engines;
    Engine* engine = engines.Keep(
        CreateLocalEngine(*source, {.kv = {.kv_cache_bytes = 8 * kBlock,
                                           .cpu_offload_bytes = 4 * kBlock,
                                           .dtype = DType::kF32},
                                    .threads = 1,
                                    .cp = cp}));
    ASSERT_NE(engine, nullptr);
    // At the second token: the figures published after the prefill step
    // (the first token's callback runs before they are).
    SchedulerStats during;
    int tokens = 0;
    auto got = engine->Generate(
        {.prompt = std::vector<int32_t>(70, 3), .max_tokens = 3}, [&](int32_t) {
          if (++tokens == 2) during = engine->stats();
          return true;
        });
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(tokens, 3);
    std::string text;
    AppendCpRankKvMetrics(text, during.device_by_cp_rank,
                          during.host_by_cp_rank);
    if (cp == 1) {
      EXPECT_EQ(text, "");
      continue;
    }
    auto m = Parse(text);
    const auto at = [&](int r, const char* tier, const char* state) {
      return m[absl::StrCat("shardlm_kv_cp_rank_blocks{cp_rank=\"", r,
                            "\",tier=\"", tier, "\",state=\"", state, "\"}")];
    };
    EXPECT_EQ(m.size(), 2u * 2 * 3);
    EXPECT_EQ(at(0, "device", "used"), 3);
    EXPECT_EQ(at(1, "device", "used"), 2);
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(at(r, "device", "used") + at(r, "device", "cached") +
                    at(r, "device", "free"),
                8);
      EXPECT_EQ(at(r, "host", "used") + at(r, "host", "cached") +
                    at(r, "host", "free"),
                4);
    }
    const std::pair<const char*, TierUsage> tiers[] = {
        {"device", during.device}, {"host", during.host}};
    for (const auto& [tier, all] : tiers) {
      EXPECT_EQ(at(0, tier, "used") + at(1, tier, "used"), all.used) << tier;
      EXPECT_EQ(at(0, tier, "cached") + at(1, tier, "cached"), all.cached)
          << tier;
      EXPECT_EQ(at(0, tier, "free") + at(1, tier, "free"), all.free) << tier;
    }
  }
}

}  // namespace
}  // namespace shardlm
