#include "worker/llama_weights.h"

#include <vector>

#include "gtest/gtest.h"
#include "model/in_memory_weights.h"
#include "model/shard_plan.h"

namespace shardlm {
namespace {

ModelConfig Config() {
  ModelConfig c;
  c.n_layers = 4;
  c.hidden = 64;
  c.ffn_hidden = 128;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 16;
  c.vocab_size = 97;
  c.context_length = 64;
  c.rope_theta = 10000.0f;
  return c;
}

struct Call {
  int64_t bytes;
  int done, total;
};

TEST(LoadProgressTest, ReportsEveryLayerOfTheShardAndEndsAtItsBytes) {
  auto source = RandomLlamaWeights(Config(), 1);
  auto plan = PlanShards(*source, 1, 2);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const ShardSpec& spec = plan->at(1, 0);  // The last stage: 2 layers.
  std::vector<Call> calls;
  auto w = LoadLlamaWeights(*source, spec, [&](int64_t b, int d, int t) {
    calls.push_back({b, d, t});
  });
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_EQ(calls.size(), 3u);  // Head first, then each layer.
  for (size_t i = 0; i < calls.size(); ++i) {
    EXPECT_EQ(calls[i].done, static_cast<int>(i));
    EXPECT_EQ(calls[i].total, 2);
    if (i > 0) EXPECT_GT(calls[i].bytes, calls[i - 1].bytes);
  }
  EXPECT_GT(calls[0].bytes, 0);  // The LM head.
  EXPECT_EQ(calls.back().bytes, w->bytes());
}

TEST(LoadProgressTest, LogSaysNothingForAQuickLoadAndProgressForASlowOne) {
  testing::internal::CaptureStderr();
  LoadProgress quick = LogLoadProgress("worker rank 1");
  quick(10 << 20, 0, 2);
  quick(20 << 20, 2, 2);
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");

  testing::internal::CaptureStderr();
  LoadProgress slow = LogLoadProgress("worker rank 2", absl::ZeroDuration());
  slow(10 << 20, 1, 4);
  slow(40 << 20, 4, 4);
  const std::string said = testing::internal::GetCapturedStderr();
  EXPECT_NE(said.find("worker rank 2: loading weights: 1 of 4 layers, 10 MiB "
                      "(25%)"),
            std::string::npos)
      << said;
  EXPECT_NE(said.find("worker rank 2: loaded 40 MiB of weights (4 layers)"),
            std::string::npos)
      << said;
}

}  // namespace
}  // namespace shardlm
