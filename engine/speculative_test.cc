// Speculative decoding through the whole engine on a small random model:
// the tokens are those of the same engine without it (greedy and seeded
// sampling, penalties, log-probabilities), at several batch sizes and
// layouts, with drafts that are kept and drafts that are rejected, under
// preemption and cancellation; every KV block comes back.
//
// Its own binary: speculation turns on the process-wide batch-invariant
// kernels (kernels/batch_invariance.h), which the other engine tests do
// not run under.
#include <algorithm>
#include <map>
#include <memory>
#include <vector>

#include "engine/drafter.h"
#include "engine/engine.h"
#include "engine/engine_leak_check.h"
#include "executor/local_engine.h"
#include "gtest/gtest.h"
#include "kernels/batch_invariance.h"
#include "model/in_memory_weights.h"

namespace shardlm {
namespace {

constexpr int32_t kVocab = 301;

ModelConfig TinyConfig() {
  ModelConfig c;
  c.n_layers = 4;
  c.hidden = 96;
  c.ffn_hidden = 160;
  c.n_heads = 6;
  c.n_kv_heads = 2;
  c.head_dim = 16;
  c.vocab_size = kVocab;
  c.context_length = 512;
  c.rope_theta = 10000.0f;
  c.rope_style = RopeStyle::kRotateHalf;
  return c;
}

std::vector<int32_t> Prompt(int n, int salt) {
  std::vector<int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back((i * 37 + salt * 101) % kVocab);
  return p;
}

// Drafts a known continuation of each prompt (a run without speculation),
// every third drafted token made wrong, so that steps keep some drafts and
// reject others. Past the known continuation (a sequence that went
// elsewhere), it drafts nothing.
class OracleDrafter : public SequenceDrafter {
 public:
  OracleDrafter(std::vector<int32_t> prompt, std::vector<int32_t> answer)
      : prompt_(std::move(prompt)), answer_(std::move(answer)) {}
  std::vector<int32_t> Draft(absl::Span<const int32_t> tokens,
                             int max_tokens) override {
    const size_t done = tokens.size() - prompt_.size();
    if (!std::equal(tokens.begin() + prompt_.size(), tokens.end(),
                    answer_.begin(),
                    answer_.begin() + std::min(done, answer_.size()))) {
      return {};
    }
    std::vector<int32_t> out;
    for (size_t i = done; i < answer_.size() && out.size() < size_t(max_tokens);
         ++i) {
      out.push_back(i % 3 == 2 ? (answer_[i] + 1) % kVocab : answer_[i]);
    }
    return out;
  }

 private:
  std::vector<int32_t> prompt_, answer_;
};

struct Layout {
  int tp = 1, pp = 1;
};

class SpeculativeTest : public ::testing::TestWithParam<Layout> {
 protected:
  void TearDown() override { engines_.Close(); }

  EngineOptions Options(int32_t max_seqs = 64) const {
    EngineOptions o;
    o.tp = GetParam().tp;
    o.pp = GetParam().pp;
    o.limits.max_seqs = max_seqs;
    o.batch_invariant = true;
    return o;
  }
  Engine* Make(EngineOptions o) {
    return engines_.Keep(CreateLocalEngine(*source_, o));
  }
  // An engine that drafts each request's continuation from `answers`
  // (by prompt), or with prompt lookup when `answers` is null.
  Engine* MakeSpeculative(
      EngineOptions o,
      const std::map<std::vector<int32_t>, std::vector<int32_t>>* answers,
      int max_tokens = 4, bool adaptive = false) {
    o.speculation.max_tokens = max_tokens;
    o.speculation.adaptive = adaptive;
    if (answers == nullptr) {
      o.speculation.method = SpeculationOptions::Method::kNgram;
      o.speculation.ngram_min = 1;
    } else {
      o.speculation.method = SpeculationOptions::Method::kCustom;
      o.speculation.make_drafter = [answers](const GenerateRequest& r) {
        const auto it = answers->find(r.prompt);
        return std::make_unique<OracleDrafter>(
            r.prompt,
            it == answers->end() ? std::vector<int32_t>{} : it->second);
      };
    }
    return Make(o);
  }

  std::unique_ptr<InMemoryWeights> source_ =
      RandomLlamaWeights(TinyConfig(), 3);
  EngineLeakCheck engines_;
};

std::vector<GenerateRequest> Requests(int n, SamplingParams sampling = {}) {
  std::vector<GenerateRequest> reqs;
  for (int i = 0; i < n; ++i) {
    reqs.push_back({.prompt = Prompt(5 + 7 * i, i + 1),
                    .max_tokens = 20 + i,
                    .sampling = sampling});
  }
  return reqs;
}

std::map<std::vector<int32_t>, std::vector<int32_t>> Answers(
    const std::vector<GenerateRequest>& reqs,
    const std::vector<GenerateResult>& results) {
  std::map<std::vector<int32_t>, std::vector<int32_t>> m;
  for (size_t i = 0; i < reqs.size(); ++i)
    m[reqs[i].prompt] = results[i].tokens;
  return m;
}

TEST_P(SpeculativeTest, GreedyTokensAreThoseWithoutSpeculation) {
  Engine* plain = Make(Options());
  for (int batch : {1, 3, 8}) {
    SCOPED_TRACE(::testing::Message() << "batch " << batch);
    const std::vector<GenerateRequest> reqs = Requests(batch);
    auto want = plain->GenerateBatch(reqs);
    ASSERT_TRUE(want.ok()) << want.status();
    const auto answers = Answers(reqs, *want);
    for (int k : {1, 4}) {
      Engine* spec = MakeSpeculative(Options(), &answers, k);
      auto got = spec->GenerateBatch(reqs);
      ASSERT_TRUE(got.ok()) << got.status();
      for (int i = 0; i < batch; ++i) {
        EXPECT_EQ((*got)[i].tokens, (*want)[i].tokens) << "request " << i;
      }
      const SchedulerStats s = spec->stats();
      EXPECT_GT(s.spec_accepted, 0);
      EXPECT_GT(s.spec_drafted, s.spec_accepted);  // Some were rejected.
      EXPECT_LT(s.steps, plain->stats().steps);    // Fewer steps: it paid.
    }
  }
}

TEST_P(SpeculativeTest, PromptLookupKeepsTheTokens) {
  // A prompt that repeats itself, so that prompt lookup drafts.
  std::vector<int32_t> prompt = Prompt(12, 4);
  for (int r = 0; r < 3; ++r) {
    prompt.insert(prompt.end(), prompt.begin(), prompt.begin() + 12);
  }
  const std::vector<GenerateRequest> reqs = {
      {.prompt = prompt, .max_tokens = 40},
      {.prompt = Prompt(9, 5), .max_tokens = 40}};
  auto want = Make(Options())->GenerateBatch(reqs);
  ASSERT_TRUE(want.ok()) << want.status();
  Engine* spec = MakeSpeculative(Options(), nullptr, 4);
  auto got = spec->GenerateBatch(reqs);
  ASSERT_TRUE(got.ok()) << got.status();
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ((*got)[i].tokens, (*want)[i].tokens) << "request " << i;
  }
  EXPECT_GT(spec->stats().spec_drafted, 0);
}

// Seeded sampling draws depend on (seed, token index) only, and a drafted
// token is kept only where the row sampled it: the same tokens, with the
// same log-probabilities, penalties and all.
TEST_P(SpeculativeTest, SeededSamplingAndLogprobsAreThoseWithoutSpeculation) {
  SamplingParams sampling{.temperature = 0.9f, .top_p = 0.95f, .seed = 11};
  sampling.frequency_penalty = 0.3f;
  std::vector<GenerateRequest> reqs = Requests(4, sampling);
  for (auto& r : reqs) r.logprobs = 3;
  reqs[1].sampling.seed = 12;
  reqs[2].sampling.repetition_penalty = 1.2f;
  reqs[3].min_tokens = 10;
  reqs[3].stop_token_ids = {7, 8, 9};
  auto want = Make(Options())->GenerateBatch(reqs);
  ASSERT_TRUE(want.ok()) << want.status();
  const auto answers = Answers(reqs, *want);
  Engine* spec = MakeSpeculative(Options(), &answers, 3);
  auto got = spec->GenerateBatch(reqs);
  ASSERT_TRUE(got.ok()) << got.status();
  for (size_t i = 0; i < reqs.size(); ++i) {
    SCOPED_TRACE(::testing::Message() << "request " << i);
    EXPECT_EQ((*got)[i].tokens, (*want)[i].tokens);
    ASSERT_EQ((*got)[i].logprobs.size(), (*want)[i].logprobs.size());
    for (size_t j = 0; j < (*got)[i].logprobs.size(); ++j) {
      EXPECT_EQ((*got)[i].logprobs[j].sampled, (*want)[i].logprobs[j].sampled);
      ASSERT_EQ((*got)[i].logprobs[j].top.size(),
                (*want)[i].logprobs[j].top.size());
      for (size_t a = 0; a < (*got)[i].logprobs[j].top.size(); ++a) {
        EXPECT_EQ((*got)[i].logprobs[j].top[a].token,
                  (*want)[i].logprobs[j].top[a].token);
      }
    }
  }
  EXPECT_GT(spec->stats().spec_accepted, 0);
}

// A cache too small for the batch: sequences are preempted (swapped or
// recomputed) between verifications, and still say the same.
TEST_P(SpeculativeTest, PreemptionBetweenVerificationsKeepsTheTokens) {
  EngineOptions o = Options();
  o.kv.block_size = 4;
  o.kv.kv_cache_bytes = int64_t{40} * 4 * 2 * TinyConfig().n_layers /
                        GetParam().pp * TinyConfig().n_kv_heads /
                        GetParam().tp * TinyConfig().head_dim * 2;
  const std::vector<GenerateRequest> reqs = Requests(6);
  auto want = Make(Options())->GenerateBatch(reqs);
  ASSERT_TRUE(want.ok()) << want.status();
  const auto answers = Answers(reqs, *want);
  Engine* spec = MakeSpeculative(o, &answers, 4);
  auto got = spec->GenerateBatch(reqs);
  ASSERT_TRUE(got.ok()) << got.status();
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ((*got)[i].tokens, (*want)[i].tokens) << "request " << i;
  }
  const SchedulerStats s = spec->stats();
  EXPECT_GT(s.preempted_swap + s.preempted_recompute, 0);
  EXPECT_GT(s.spec_accepted, 0);
}

// Cancelling sequences while their verifications run frees their blocks
// (the leak check at TearDown) and leaves the others' tokens alone.
TEST_P(SpeculativeTest, CancellationDuringVerificationFreesEverything) {
  const std::vector<GenerateRequest> reqs = Requests(4);
  auto want = Make(Options())->GenerateBatch(reqs);
  ASSERT_TRUE(want.ok()) << want.status();
  const auto answers = Answers(reqs, *want);
  Engine* spec = MakeSpeculative(Options(), &answers, 4);
  auto got = spec->GenerateBatch(reqs, [](size_t i, int32_t) {
    static thread_local int seen[4] = {};
    return !(i % 2 == 1 && ++seen[i] >= 5);  // Cancel 1 and 3 early.
  });
  ASSERT_TRUE(got.ok()) << got.status();
  for (size_t i = 0; i < reqs.size(); ++i) {
    if (i % 2 == 1) {
      EXPECT_EQ((*got)[i].finish_reason, FinishReason::kCancelled);
      EXPECT_TRUE(std::equal((*got)[i].tokens.begin(), (*got)[i].tokens.end(),
                             (*want)[i].tokens.begin()));
    } else {
      EXPECT_EQ((*got)[i].tokens, (*want)[i].tokens) << "request " << i;
    }
  }
}

// A request that opts out verifies nothing, beside one that drafts.
TEST_P(SpeculativeTest, ARequestMayOptOut) {
  std::vector<GenerateRequest> reqs = Requests(1);
  auto want = Make(Options())->GenerateBatch(reqs);
  ASSERT_TRUE(want.ok()) << want.status();
  const auto answers = Answers(reqs, *want);
  Engine* spec = MakeSpeculative(Options(), &answers, 4);
  reqs[0].speculative = false;
  auto got = spec->GenerateBatch(reqs);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ((*got)[0].tokens, (*want)[0].tokens);
  EXPECT_EQ(spec->stats().spec_drafted, 0);
}

INSTANTIATE_TEST_SUITE_P(Layouts, SpeculativeTest,
                         ::testing::Values(Layout{1, 1}, Layout{2, 1},
                                           Layout{2, 2}),
                         [](const auto& info) {
                           return "tp" + std::to_string(info.param.tp) + "_pp" +
                                  std::to_string(info.param.pp);
                         });

// What speculation cannot do yet is refused by name, not run wrong.
TEST(SpeculativeRefusalsTest, ContextParallelAndCudaAreRefused) {
  auto source = RandomLlamaWeights(TinyConfig(), 3);
  EngineOptions o;
  o.speculation.method = SpeculationOptions::Method::kNgram;
  o.cp = 2;
  auto made = CreateLocalEngine(*source, o);
  ASSERT_FALSE(made.ok());
  EXPECT_EQ(made.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(made.status().message().find("--cp 2"), std::string::npos);
  o.cp = 1;
  o.speculation.max_tokens = 0;
  made = CreateLocalEngine(*source, o);
  ASSERT_FALSE(made.ok());
  EXPECT_NE(made.status().message().find("--num-speculative-tokens"),
            std::string::npos);
}

}  // namespace
}  // namespace shardlm
