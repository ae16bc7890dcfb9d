// Log-probabilities against an independent reference: for every generated
// token, log_softmax (in double) of the full logits at that position,
// obtained by running the prompt plus the tokens so far as a new prompt
// with return_prompt_logits. On a random model and on SmolLM2-135M
// (SHARDLM_TEST_MODEL, set by CMake; missing is a failure).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <numeric>

#include "engine/engine.h"
#include "engine/engine_leak_check.h"
#include "executor/local_engine.h"
#include "gtest/gtest.h"
#include "model/in_memory_weights.h"
#include "model/smollm2_test_model.h"

namespace shardlm {
namespace {

std::vector<double> LogSoftmax(const std::vector<float>& logits) {
  double max = -INFINITY, sum = 0;
  for (float l : logits) max = std::max<double>(max, l);
  for (float l : logits) sum += std::exp(l - max);
  std::vector<double> out;
  for (float l : logits) out.push_back(l - max - std::log(sum));
  return out;
}

// Generates from `prompt` with logprobs = `top`, then checks each token's
// log-probabilities against the reference, within `tol`.
void ExpectReferenceLogprobs(Engine& engine, const std::vector<int32_t>& prompt,
                             const SamplingParams& sampling, int top,
                             double tol) {
  auto got = engine.Generate({.prompt = prompt,
                              .max_tokens = 6,
                              .sampling = sampling,
                              .logprobs = top});
  ASSERT_TRUE(got.ok()) << got.status();
  // No stop token: all 6 are generated (zero tokens would check nothing).
  ASSERT_EQ(got->tokens.size(), 6u);
  ASSERT_EQ(got->logprobs.size(), got->tokens.size());
  std::vector<int32_t> context = prompt;
  for (size_t i = 0; i < got->tokens.size(); ++i) {
    SCOPED_TRACE(::testing::Message() << "token " << i);
    auto ref_run = engine.Generate(
        {.prompt = context, .max_tokens = 1, .return_prompt_logits = true});
    ASSERT_TRUE(ref_run.ok()) << ref_run.status();
    const std::vector<double> ref = LogSoftmax(ref_run->prompt_logits);
    std::vector<int32_t> order(ref.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return ref[a] > ref[b]; });
    const int32_t token = got->tokens[i];
    const TokenLogprobs& lp = got->logprobs[i];
    EXPECT_NEAR(lp.sampled, ref[token], tol);
    ASSERT_EQ(lp.top.size(), static_cast<size_t>(top));
    for (int k = 0; k < top; ++k) {
      EXPECT_NEAR(lp.top[k].logprob, ref[lp.top[k].token], tol) << k;
      // The k-th most likely, up to ties within the tolerance.
      EXPECT_NEAR(ref[lp.top[k].token], ref[order[k]], tol) << k;
    }
    if (sampling.temperature == 0) {
      EXPECT_EQ(lp.top[0].token, token);  // Greedy takes the top-1.
      EXPECT_EQ(lp.sampled, lp.top[0].logprob);
    }
    std::printf("token %zu: %d logprob %.5f (reference %.5f)\n", i, token,
                lp.sampled, ref[token]);
    context.push_back(token);
  }
}

TEST(LogprobsTest, RandomModelMatchesLogSoftmax) {
  ModelConfig c;
  c.n_layers = 2;
  c.hidden = 64;
  c.ffn_hidden = 96;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 16;
  c.vocab_size = 301;
  c.context_length = 128;
  c.rope_theta = 10000.0f;
  auto source = RandomLlamaWeights(c, 5);
  EngineLeakCheck engines;
  Engine* engine = engines.Keep(CreateLocalEngine(*source, {.threads = 1}));
  ASSERT_NE(engine, nullptr);
  ExpectReferenceLogprobs(*engine, {3, 1, 4, 1, 5, 9, 2, 6}, {}, 7, 1e-4);
  ExpectReferenceLogprobs(*engine, {2, 7, 1, 8},
                          {.temperature = 1.3f, .top_p = 0.8f, .seed = 4}, 3,
                          1e-4);
}

TEST(LogprobsTest, SmolLm2MatchesLogSoftmax) {
  const std::string path = testing_util::SmolLm2ModelPath();
  ASSERT_FALSE(path.empty());
  auto source = OpenWeights(path);
  ASSERT_TRUE(source.ok()) << source.status();
  EngineLeakCheck engines;
  Engine* engine = engines.Keep(CreateLocalEngine(**source, {}));
  ASSERT_NE(engine, nullptr);
  // "The capital of France is", greedy; then sampled at temperature 0.8
  // with top_k 10: the log-probabilities stay the raw model's.
  const std::vector<int32_t> prompt = {504, 3575, 282, 4649, 314};
  ExpectReferenceLogprobs(*engine, prompt, {}, 5, 1e-3);
  ExpectReferenceLogprobs(
      *engine, prompt, {.temperature = 0.8f, .top_k = 10, .seed = 3}, 5, 1e-3);
}

}  // namespace
}  // namespace shardlm
