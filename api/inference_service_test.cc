// The gRPC API end to end on a small random model: a real server on a free
// local port and a real client. Streams must carry exactly the engine's
// tokens, bad requests get precise codes and change nothing, cancellation
// frees every block.
#include "api/inference_service.h"

#include <atomic>
#include <cmath>
#include <future>
#include <limits>
#include <numeric>
#include <set>
#include <thread>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "api/api_server.h"
#include "engine/engine_leak_check.h"
#include "engine/prefix_hash.h"
#include "executor/in_process_executor.h"
#include "executor/local_engine.h"
#include "grammar/grammar.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "model/in_memory_weights.h"
#include "shardlm/v1/replica_state.grpc.pb.h"

namespace shardlm {
namespace {

constexpr int32_t kVocab = 301;
constexpr int32_t kEos = 256;
constexpr int32_t kImEnd = 257;
constexpr int32_t kImStart = 258;

// Ids 0..127 are ASCII bytes, 128..255 the two-byte characters U+00C0 +
// (id - 128), 256..258 the specials, 259.. the words "<tN>". Every token is
// whole UTF-8, so streamed text concatenates to Decode exactly. Characters
// it has no token for are dropped.
class FakeTokenizer final : public Tokenizer {
 public:
  FakeTokenizer() {
    for (int32_t i = 0; i < kVocab; ++i) {
      if (i < 128) {
        pieces_.push_back(std::string(1, static_cast<char>(i)));
      } else if (i < 256) {
        const int cp = 0xC0 + (i - 128);
        pieces_.push_back({static_cast<char>(0xC0 | (cp >> 6)),
                           static_cast<char>(0x80 | (cp & 0x3F))});
      } else if (i == kEos) {
        pieces_.push_back("<|endoftext|>");
      } else if (i == kImEnd) {
        pieces_.push_back("<|im_end|>");
      } else if (i == kImStart) {
        pieces_.push_back("<|im_start|>");
      } else {
        pieces_.push_back("<t" + std::to_string(i) + ">");
      }
    }
  }
  std::vector<int32_t> Encode(std::string_view text) const override {
    std::vector<int32_t> ids;
    size_t i = 0;
    while (i < text.size()) {
      bool matched = false;
      for (int32_t id = 256; id < kVocab && !matched; ++id) {
        if (text.substr(i).starts_with(pieces_[id])) {
          ids.push_back(id);
          i += pieces_[id].size();
          matched = true;
        }
      }
      if (matched) continue;
      const auto c = static_cast<unsigned char>(text[i]);
      if (c < 0x80) {
        ids.push_back(c);
        ++i;
      } else if ((c & 0xE0) == 0xC0 && i + 1 < text.size()) {
        const int cp = ((c & 0x1F) << 6) | (text[i + 1] & 0x3F);
        if (cp >= 0xC0 && cp < 0xC0 + 128) ids.push_back(128 + cp - 0xC0);
        i += 2;
      } else {
        ++i;
      }
    }
    return ids;
  }
  std::string_view TokenBytes(int32_t id) const override {
    return id >= 0 && id < kVocab ? std::string_view(pieces_[id]) : "";
  }
  int32_t vocab_size() const override { return kVocab; }
  int32_t bos_id() const override { return -1; }
  int32_t eos_id() const override { return kEos; }
  bool IsSpecial(int32_t id) const override { return id >= 256 && id <= 258; }
  std::optional<int32_t> TokenId(std::string_view token) const override {
    for (int32_t i = 0; i < kVocab; ++i) {
      if (pieces_[i] == token) return i;
    }
    return std::nullopt;
  }
  std::string Summary() const override { return "fake byte tokenizer"; }

 private:
  std::vector<std::string> pieces_;
};

ModelConfig TinyConfig() {
  ModelConfig c;
  c.name = "tiny-random";
  c.n_layers = 2;
  c.hidden = 64;
  c.ffn_hidden = 96;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 16;
  c.vocab_size = kVocab;
  c.context_length = 256;
  c.rope_theta = 10000.0f;
  c.eos_id = kEos;
  return c;
}

// 2 (K, V) x 2 layers x 2 KV heads x 16 x 2 bytes (f16, the default) per
// token, 16 tokens a block: 8 blocks, 128 tokens of KV, less than the
// context window.
constexpr int64_t kBlockBytes = 2 * 2 * 2 * 16 * 2 * 16;
constexpr int32_t kBlocks = 8;

struct Streamed {
  grpc::Status status;
  std::vector<v1::GenerateResponse> responses;
  std::vector<int32_t> tokens;
  std::string text;
};

class InferenceServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    weights_ = RandomLlamaWeights(TinyConfig(), 7);
    engine_ = engines_.Keep(CreateLocalEngine(
        *weights_,
        {.kv = {.kv_cache_bytes = kBlocks * kBlockBytes}, .threads = 1}));
    ASSERT_NE(engine_, nullptr);
    ASSERT_EQ(engine_->blocks().num_blocks(), kBlocks);
    auto server =
        ApiServer::Start(engine_, &tokenizer_,
                         {.listen_address = "127.0.0.1:0",
                          .model_name = "tiny",
                          .service = {.tp = 1, .pp = 1},
                          .health_poll = std::chrono::milliseconds(20)});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    ASSERT_GT(server_->port(), 0);
    channel_ =
        grpc::CreateChannel("127.0.0.1:" + std::to_string(server_->port()),
                            grpc::InsecureChannelCredentials());
    stub_ = v1::Inference::NewStub(channel_);
  }
  // The server first: once no call can reach the engine, every block
  // must be back, whatever the test checked itself.
  void TearDown() override {
    if (server_) server_->Shutdown();
    engines_.Close();
  }

  Streamed Call(const v1::GenerateRequest& req) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(60));
    Streamed out;
    auto reader = stub_->Generate(&ctx, req);
    v1::GenerateResponse r;
    while (reader->Read(&r)) {
      out.tokens.insert(out.tokens.end(), r.token_ids().begin(),
                        r.token_ids().end());
      out.text += r.text();
      out.responses.push_back(r);
    }
    out.status = reader->Finish();
    return out;
  }

  // What the service should hand the engine for `prompt`: the default stop
  // tokens are the model's EOS and <|im_end|>.
  GenerateResult Direct(const std::vector<int32_t>& prompt, int32_t max_tokens,
                        SamplingParams sampling = {},
                        std::vector<int32_t> stops = {kEos, kEos, kImEnd}) {
    auto r = engine_->Generate({.prompt = prompt,
                                .max_tokens = max_tokens,
                                .sampling = sampling,
                                .stop_token_ids = std::move(stops)});
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : GenerateResult{};
  }

  // Text a client should see for `tokens`: everything but stop tokens.
  std::string Visible(const std::vector<int32_t>& tokens,
                      const std::vector<int32_t>& stops) {
    std::vector<int32_t> shown;
    for (int32_t t : tokens) {
      if (std::find(stops.begin(), stops.end(), t) == stops.end()) {
        shown.push_back(t);
      }
    }
    return tokenizer_.Decode(shown);
  }

  std::unique_ptr<InMemoryWeights> weights_;
  FakeTokenizer tokenizer_;
  EngineLeakCheck engines_;  // Outlives server_, which calls the engine.
  Engine* engine_ = nullptr;
  std::unique_ptr<ApiServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Inference::Stub> stub_;
};

void ExpectFinal(const Streamed& s, const std::string& reason, int prompt,
                 size_t completion) {
  ASSERT_FALSE(s.responses.empty());
  const v1::GenerateResponse& last = s.responses.back();
  EXPECT_EQ(last.finish_reason(), reason);
  EXPECT_EQ(last.usage().prompt_tokens(), prompt);
  EXPECT_EQ(last.usage().completion_tokens(), static_cast<int>(completion));
  for (size_t i = 0; i + 1 < s.responses.size(); ++i) {
    EXPECT_EQ(s.responses[i].finish_reason(), "") << "response " << i;
    EXPECT_EQ(s.responses[i].token_ids_size(), 1) << "response " << i;
  }
}

TEST_F(InferenceServiceTest, GreedyStreamEqualsEngine) {
  v1::GenerateRequest req;
  req.set_prompt("Hello, wörld! <t300>");
  req.set_max_tokens(20);
  req.set_ignore_eos(true);  // Random models may say EOS at any point.
  const std::vector<int32_t> prompt = tokenizer_.Encode(req.prompt());
  const GenerateResult want = Direct(prompt, 20, {}, {});
  const Streamed got = Call(req);
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_EQ(got.responses.size(), 20u);  // One per token, the last final.
  ExpectFinal(got, "length", static_cast<int>(prompt.size()), 20);
  EXPECT_EQ(got.text, tokenizer_.Decode(want.tokens));
  EXPECT_EQ(engine_->blocks().used_blocks(), 0);
}

TEST_F(InferenceServiceTest, SeededSamplingFromTokenIdsEqualsEngine) {
  v1::GenerateRequest req;
  for (int i = 0; i < 30; ++i) req.add_prompt_token_ids((i * 37 + 5) % 256);
  req.set_prompt("ignored: ids take precedence");
  req.set_max_tokens(24);
  req.mutable_sampling()->set_temperature(0.8f);
  req.mutable_sampling()->set_top_k(50);
  req.mutable_sampling()->set_top_p(0.9f);
  req.mutable_sampling()->set_seed(1234);
  const std::vector<int32_t> prompt(req.prompt_token_ids().begin(),
                                    req.prompt_token_ids().end());
  const SamplingParams sampling{
      .temperature = 0.8f, .top_k = 50, .top_p = 0.9f, .seed = 1234};
  const GenerateResult want = Direct(prompt, 24, sampling);
  const Streamed got = Call(req);
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  EXPECT_EQ(got.tokens, want.tokens);
  ExpectFinal(got,
              want.finish_reason == FinishReason::kStop ? "stop" : "length", 30,
              want.tokens.size());
  EXPECT_EQ(got.text, Visible(want.tokens, {kEos, kImEnd}));
  // The same seed again, the same stream.
  EXPECT_EQ(Call(req).tokens, got.tokens);
}

// n = 3 seeded: choice i is the engine's run with seed + i, and the three
// run in the same steps (one intake, after the prompt's one-token prefill
// request): 1 + max_tokens steps in all, whichever thread got there first.
TEST_F(InferenceServiceTest, SeededChoicesRunTogetherAsTheirSeedsAlone) {
  ASSERT_TRUE(engine_->blocks().prefix_caching());
  v1::GenerateRequest req;
  for (int i = 0; i < 20; ++i) req.add_prompt_token_ids((i * 29 + 3) % 256);
  req.set_max_tokens(8);
  req.set_ignore_eos(true);
  req.set_n(3);
  req.mutable_sampling()->set_temperature(1.0f);
  req.mutable_sampling()->set_seed(99);
  const std::vector<int32_t> prompt(req.prompt_token_ids().begin(),
                                    req.prompt_token_ids().end());
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE(::testing::Message() << "round " << round);
    const int64_t before = engine_->steps();
    const Streamed got = Call(req);
    ASSERT_TRUE(got.status.ok()) << got.status.error_message();
    EXPECT_EQ(engine_->steps() - before, 1 + 8);
    std::vector<std::vector<int32_t>> by_choice(3);
    for (const v1::GenerateResponse& r : got.responses) {
      ASSERT_TRUE(r.index() >= 0 && r.index() < 3) << r.index();
      by_choice[r.index()].insert(by_choice[r.index()].end(),
                                  r.token_ids().begin(), r.token_ids().end());
    }
    for (int i = 0; i < 3; ++i) {
      const GenerateResult want =
          Direct(prompt, 8, {.temperature = 1.0f, .seed = 99u + i}, {});
      EXPECT_EQ(by_choice[i], want.tokens) << "choice " << i;
    }
    EXPECT_NE(by_choice[0], by_choice[1]);
  }
  EXPECT_EQ(engine_->blocks().used_blocks(), 0);
}

TEST_F(InferenceServiceTest, StopTokenEndsStreamAndIsNotPrinted) {
  const std::vector<int32_t> prompt = tokenizer_.Encode("stop here");
  const GenerateResult free_run = Direct(prompt, 12, {}, {});
  ASSERT_EQ(free_run.tokens.size(), 12u);
  const int32_t stop = free_run.tokens[4];
  const size_t first =
      std::find(free_run.tokens.begin(), free_run.tokens.end(), stop) -
      free_run.tokens.begin();
  v1::GenerateRequest req;
  req.set_prompt("stop here");
  req.set_max_tokens(12);
  req.set_ignore_eos(true);
  req.add_stop_token_ids(stop);
  const Streamed got = Call(req);
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  const std::vector<int32_t> want(free_run.tokens.begin(),
                                  free_run.tokens.begin() + first + 1);
  EXPECT_EQ(got.tokens, want);  // The stop token's id is reported...
  ExpectFinal(got, "stop", static_cast<int>(prompt.size()), want.size());
  EXPECT_EQ(got.text, Visible(want, {stop}));  // ...but not its text.
}

// The text of `tokens` up to the first occurrence of any of `stops`, and
// how many tokens it took for the text to contain one (0: none occurs).
std::pair<std::string, size_t> CutAtStop(
    const Tokenizer& tok, const std::vector<int32_t>& tokens,
    const std::vector<std::string>& stops) {
  for (size_t n = 1; n <= tokens.size(); ++n) {
    const std::string text =
        tok.Decode(absl::Span<const int32_t>(tokens.data(), n));
    size_t first = std::string::npos;
    for (const auto& s : stops) first = std::min(first, text.find(s));
    if (first != std::string::npos) return {text.substr(0, first), n};
  }
  return {tok.Decode(tokens), 0};
}

TEST_F(InferenceServiceTest, StopStringsCutTheTextBeforeThem) {
  const std::vector<int32_t> prompt = tokenizer_.Encode("stop strings");
  const GenerateResult free_run = Direct(prompt, 24, {}, {});
  ASSERT_EQ(free_run.tokens.size(), 24u);
  const auto text_of = [&](size_t from, size_t to) {
    return tokenizer_.Decode(
        absl::Span<const int32_t>(free_run.tokens.data() + from, to - from));
  };
  // A stop string spanning tokens 6..8 (held back over several tokens), one
  // that starts like tokens 3..5 but never completes ("€" has no token), and
  // both: the first wins, the other's held text comes out.
  const std::vector<std::vector<std::string>> stop_sets = {
      {text_of(6, 9)},
      {text_of(3, 6) + "€"},
      {text_of(3, 6) + "€", text_of(6, 9)}};
  for (const auto& stops : stop_sets) {
    SCOPED_TRACE(stops.back());
    const auto [want_text, stop_at] =
        CutAtStop(tokenizer_, free_run.tokens, stops);
    v1::GenerateRequest req;
    req.set_prompt("stop strings");
    req.set_max_tokens(24);
    req.set_ignore_eos(true);
    for (const auto& s : stops) req.add_stop(s);
    const Streamed got = Call(req);
    ASSERT_TRUE(got.status.ok()) << got.status.error_message();
    EXPECT_EQ(got.text, want_text);
    const size_t n = stop_at == 0 ? 24 : stop_at;
    EXPECT_EQ(got.tokens, std::vector<int32_t>(free_run.tokens.begin(),
                                               free_run.tokens.begin() + n));
    ExpectFinal(got, stop_at == 0 ? "length" : "stop",
                static_cast<int>(prompt.size()), n);
    EXPECT_EQ(engine_->blocks().used_blocks(), 0);
  }
  // The stop string found must be the one in the middle (not earlier).
  EXPECT_GT(CutAtStop(tokenizer_, free_run.tokens, stop_sets[0]).second, 0u);
}

// log_softmax of one row of logits, in double.
std::vector<double> LogSoftmax(const std::vector<float>& logits) {
  double max = -INFINITY, sum = 0;
  for (float l : logits) max = std::max<double>(max, l);
  for (float l : logits) sum += std::exp(l - max);
  std::vector<double> out;
  for (float l : logits) out.push_back(l - max - std::log(sum));
  return out;
}

TEST_F(InferenceServiceTest, LogprobsAreTheModelsLogSoftmax) {
  const std::vector<int32_t> prompt = tokenizer_.Encode("log probs");
  // Sampled at temperature 0.7 with top_k 5: the log-probabilities are
  // still those of the raw logits (temperature 1, no top_k).
  const SamplingParams sampling{.temperature = 0.7f, .top_k = 5, .seed = 9};
  auto want = engine_->Generate({.prompt = prompt,
                                 .max_tokens = 8,
                                 .sampling = sampling,
                                 .return_prompt_logits = true,
                                 .logprobs = 20});
  ASSERT_TRUE(want.ok()) << want.status();
  v1::GenerateRequest req;
  req.set_prompt("log probs");
  req.set_max_tokens(8);
  req.set_ignore_eos(true);
  req.set_logprobs(20);
  req.mutable_sampling()->set_temperature(0.7f);
  req.mutable_sampling()->set_top_k(5);
  req.mutable_sampling()->set_seed(9);
  const Streamed got = Call(req);
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  ASSERT_EQ(got.tokens, want->tokens);
  ASSERT_EQ(got.responses.size(), 8u);
  for (size_t i = 0; i < got.responses.size(); ++i) {
    const v1::GenerateResponse& r = got.responses[i];
    ASSERT_EQ(r.logprobs_size(), 1) << i;
    const v1::TokenLogprobs& lp = r.logprobs(0);
    EXPECT_EQ(lp.token().token_id(), got.tokens[i]);
    EXPECT_EQ(lp.token().text(), tokenizer_.Decode({got.tokens[i]}));
    EXPECT_FLOAT_EQ(lp.token().logprob(), want->logprobs[i].sampled);
    ASSERT_EQ(lp.top_size(), 20);
    for (int k = 0; k < 20; ++k) {
      EXPECT_EQ(lp.top(k).token_id(), want->logprobs[i].top[k].token);
      EXPECT_FLOAT_EQ(lp.top(k).logprob(), want->logprobs[i].top[k].logprob);
      EXPECT_EQ(lp.top(k).text(), tokenizer_.Decode({lp.top(k).token_id()}));
      if (k > 0) {
        EXPECT_LE(lp.top(k).logprob(), lp.top(k - 1).logprob());
      }
    }
  }
  // The first token against log_softmax of the full logits, in double.
  const std::vector<double> ref = LogSoftmax(want->prompt_logits);
  std::vector<int32_t> order(ref.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return ref[a] > ref[b]; });
  const v1::TokenLogprobs& first = got.responses[0].logprobs(0);
  EXPECT_NEAR(first.token().logprob(), ref[got.tokens[0]], 1e-5);
  for (int k = 0; k < 20; ++k) {
    EXPECT_EQ(first.top(k).token_id(), order[k]) << k;
    EXPECT_NEAR(first.top(k).logprob(), ref[order[k]], 1e-5) << k;
  }
  // Top-k 5 sampling draws from the 5 most likely.
  EXPECT_LT(
      std::find(order.begin(), order.end(), got.tokens[0]) - order.begin(), 5);
}

// A grammar constrains what a (random) model writes: every sampled output
// is a sentence of it, ended by the end-of-text token, which is not shown.
TEST_F(InferenceServiceTest, GrammarConstrainsTheOutput) {
  const std::string gbnf = "root ::= \"ab\" [0-9] [0-9]? (\"!\" | \"?\")\n";
  absl::StatusOr<Grammar> grammar = ParseGbnf(gbnf);
  ASSERT_TRUE(grammar.ok()) << grammar.status();
  for (uint64_t seed = 1; seed <= 8; ++seed) {
    v1::GenerateRequest req;
    req.set_prompt("Hello");
    req.set_max_tokens(16);
    req.mutable_sampling()->set_temperature(1.0f);
    req.mutable_sampling()->set_seed(seed);
    req.mutable_constraint()->set_grammar(gbnf);
    const Streamed got = Call(req);
    ASSERT_TRUE(got.status.ok()) << got.status.error_message();
    EXPECT_TRUE(grammar->Accepts(got.text)) << got.text;
    ASSERT_FALSE(got.responses.empty());
    EXPECT_EQ(got.responses.back().finish_reason(), "stop");
    ASSERT_FALSE(got.tokens.empty());
    EXPECT_TRUE(got.tokens.back() == kEos || got.tokens.back() == kImEnd);
  }
  EXPECT_EQ(engine_->blocks().used_blocks(), 0);
}

TEST_F(InferenceServiceTest, TruncatePromptTokensKeepsTheEnd) {
  std::vector<int32_t> ids;
  for (int i = 0; i < 300; ++i) ids.push_back((i * 13 + 1) % 256);
  const std::vector<int32_t> tail(ids.end() - 40, ids.end());
  const GenerateResult want = Direct(tail, 6, {}, {});
  v1::GenerateRequest req;
  for (int32_t t : ids) req.add_prompt_token_ids(t);  // Over 256 alone.
  req.set_max_tokens(6);
  req.set_ignore_eos(true);
  req.set_truncate_prompt_tokens(40);
  const Streamed got = Call(req);
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  EXPECT_EQ(got.tokens, want.tokens);
  ExpectFinal(got, "length", 40, 6);  // Usage counts the tokens kept.

  // Without truncation the same prompt is refused, with the numbers.
  req.set_truncate_prompt_tokens(0);
  const Streamed refused = Call(req);
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(refused.status.error_message().find(
                "prompt (300 tokens) + max_tokens (6) = 306 exceeds the "
                "context window of 256"),
            std::string::npos)
      << refused.status.error_message();

  // A limit above the prompt's length keeps it whole.
  v1::GenerateRequest small;
  small.set_prompt("abc");
  small.set_max_tokens(3);
  small.set_ignore_eos(true);
  small.set_truncate_prompt_tokens(100);
  const Streamed whole = Call(small);
  ASSERT_TRUE(whole.status.ok()) << whole.status.error_message();
  EXPECT_EQ(whole.tokens, Direct(tokenizer_.Encode("abc"), 3, {}, {}).tokens);
  ExpectFinal(whole, "length", 3, 3);
  EXPECT_EQ(engine_->blocks().used_blocks(), 0);
}

TEST_F(InferenceServiceTest, DefaultMaxTokensIs16) {
  v1::GenerateRequest req;
  req.set_prompt("abc");
  req.set_ignore_eos(true);
  const Streamed got = Call(req);
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  EXPECT_EQ(got.tokens.size(), 16u);
  ExpectFinal(got, "length", 3, 16);
}

// "hi" for 4 tokens, a valid request, changed by `edit`.
v1::GenerateRequest ValidRequestBut(auto&& edit) {
  v1::GenerateRequest r;
  r.set_prompt("hi");
  r.set_max_tokens(4);
  edit(r);
  return r;
}

// A request the service refuses (INVALID_ARGUMENT), and a part of the
// message saying why.
struct BadRequest {
  std::string name;
  v1::GenerateRequest req;
  std::string needle;
};

// Prompts, lengths (the context, the KV cache), token ids and sampling
// fields out of range.
std::vector<BadRequest> BadRangeRequests() {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  return {
      {"no prompt", ValidRequestBut([](auto& r) { r.clear_prompt(); }),
       "prompt"},
      {"negative max_tokens",
       ValidRequestBut([](auto& r) { r.set_max_tokens(-1); }), "max_tokens"},
      {"max_tokens over context",
       ValidRequestBut([](auto& r) { r.set_max_tokens(257); }), "max_tokens"},
      {"negative temperature", ValidRequestBut([](auto& r) {
         r.mutable_sampling()->set_temperature(-1);
       }),
       "temperature"},
      {"NaN temperature", ValidRequestBut([&](auto& r) {
         r.mutable_sampling()->set_temperature(nan);
       }),
       "temperature"},
      {"negative top_k",
       ValidRequestBut([](auto& r) { r.mutable_sampling()->set_top_k(-3); }),
       "top_k"},
      {"top_p over 1",
       ValidRequestBut([](auto& r) { r.mutable_sampling()->set_top_p(1.5f); }),
       "top_p"},
      {"negative top_p",
       ValidRequestBut([](auto& r) { r.mutable_sampling()->set_top_p(-0.5f); }),
       "top_p"},
      {"negative token id",
       ValidRequestBut([](auto& r) { r.add_prompt_token_ids(-1); }),
       "vocabulary"},
      {"token id == vocab",
       ValidRequestBut([](auto& r) { r.add_prompt_token_ids(kVocab); }),
       "vocabulary"},
      {"stop id out of vocab",
       ValidRequestBut([](auto& r) { r.add_stop_token_ids(kVocab + 9); }),
       "stop_token"},
      {"prompt encodes to nothing",
       ValidRequestBut([](auto& r) { r.set_prompt("\xF0\x9F\x98\x80"); }),
       "no tokens"},
      // Fits the context (256) but not the KV cache (8 blocks of 16).
      {"over KV capacity", ValidRequestBut([](auto& r) {
         for (int i = 0; i < 100; ++i) r.add_prompt_token_ids(i);
         r.set_max_tokens(100);
       }),
       "KV blocks"},
      {"over the context window", ValidRequestBut([](auto& r) {
         for (int i = 0; i < 200; ++i) r.add_prompt_token_ids(i);
         r.set_max_tokens(100);
       }),
       "context window"},
      {"infinite temperature", ValidRequestBut([](auto& r) {
         r.mutable_sampling()->set_temperature(
             std::numeric_limits<float>::infinity());
       }),
       "temperature"},
      {"NaN top_p",
       ValidRequestBut([&](auto& r) { r.mutable_sampling()->set_top_p(nan); }),
       "top_p"},
  };
}

// Stop strings, logprobs, penalties, logit_bias, min_tokens and
// truncate_prompt_tokens out of range.
std::vector<BadRequest> BadLimitRequests() {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  return {
      {"9 stop strings", ValidRequestBut([](auto& r) {
         for (int i = 0; i < 9; ++i) r.add_stop(std::string(1, 'a' + i));
       }),
       "at most 8 stop strings, got 9"},
      {"empty stop string", ValidRequestBut([](auto& r) {
         r.add_stop("ok");
         r.add_stop("");
       }),
       "stop[1] must be 1 to 256 bytes, got 0"},
      {"257-byte stop string",
       ValidRequestBut([](auto& r) { r.add_stop(std::string(257, 'x')); }),
       "stop[0] must be 1 to 256 bytes, got 257"},
      {"logprobs over 20", ValidRequestBut([](auto& r) { r.set_logprobs(21); }),
       "logprobs must be in [0, 20], got 21"},
      {"negative logprobs",
       ValidRequestBut([](auto& r) { r.set_logprobs(-1); }),
       "logprobs must be in [0, 20], got -1"},
      {"presence_penalty over 2", ValidRequestBut([](auto& r) {
         r.mutable_sampling()->set_presence_penalty(2.5f);
       }),
       "sampling: presence_penalty must be in [-2, 2], got 2.5"},
      {"NaN frequency_penalty", ValidRequestBut([&](auto& r) {
         r.mutable_sampling()->set_frequency_penalty(nan);
       }),
       "sampling: frequency_penalty must be in [-2, 2], got nan"},
      {"frequency_penalty under -2", ValidRequestBut([](auto& r) {
         r.mutable_sampling()->set_frequency_penalty(-3);
       }),
       "sampling: frequency_penalty must be in [-2, 2], got -3"},
      {"negative repetition_penalty", ValidRequestBut([](auto& r) {
         r.mutable_sampling()->set_repetition_penalty(-1);
       }),
       "sampling: repetition_penalty must be > 0 and finite, got -1"},
      {"logit_bias id outside the vocabulary", ValidRequestBut([](auto& r) {
         (*r.mutable_sampling()->mutable_logit_bias())[kVocab] = 1;
       }),
       "sampling: logit_bias token 301 is outside the vocabulary of 301"},
      {"negative logit_bias id", ValidRequestBut([](auto& r) {
         (*r.mutable_sampling()->mutable_logit_bias())[-2] = 1;
       }),
       "sampling: logit_bias token -2 is not a token id (negative)"},
      {"logit_bias over 100", ValidRequestBut([](auto& r) {
         (*r.mutable_sampling()->mutable_logit_bias())[3] = 101;
       }),
       "sampling: logit_bias of token 3 must be in [-100, 100], got 101"},
      {"301 logit_bias entries", ValidRequestBut([](auto& r) {
         for (int i = 0; i < 301; ++i) {
           (*r.mutable_sampling()->mutable_logit_bias())[i] = 1;
         }
       }),
       "sampling: at most 300 logit_bias entries, got 301"},
      {"min_tokens over max_tokens", ValidRequestBut([](auto& r) {
         r.set_max_tokens(4);
         r.set_min_tokens(5);
       }),
       "min_tokens must be in [0, max_tokens = 4], got 5"},
      {"negative min_tokens",
       ValidRequestBut([](auto& r) { r.set_min_tokens(-1); }),
       "min_tokens must be in [0, max_tokens"},
      {"negative truncate_prompt_tokens",
       ValidRequestBut([](auto& r) { r.set_truncate_prompt_tokens(-5); }),
       "truncate_prompt_tokens must be >= 0"},
  };
}

// Truncated prompts that still do not fit, and constraints that do not
// compile or cannot end.
std::vector<BadRequest> BadFitAndConstraintRequests() {
  return {
      // Truncated to 250, + 10 is still over the context window (256).
      {"truncated prompt still over the context", ValidRequestBut([](auto& r) {
         for (int i = 0; i < 300; ++i) r.add_prompt_token_ids(i % 200);
         r.set_truncate_prompt_tokens(250);
         r.set_max_tokens(10);
       }),
       "prompt (250 tokens) + max_tokens (10) = 260 exceeds the context "
       "window of 256"},
      // Truncated to 120, + 100 fits the context but not the cache.
      {"truncated prompt over KV capacity", ValidRequestBut([](auto& r) {
         for (int i = 0; i < 300; ++i) r.add_prompt_token_ids(i % 200);
         r.set_truncate_prompt_tokens(120);
         r.set_max_tokens(100);
       }),
       "prompt + max_tokens = 220 tokens need 14 KV blocks of 16 tokens but "
       "the cache holds 8 (8 device + 0 host)"},
      {"a schema keyword outside the subset", ValidRequestBut([](auto& r) {
         r.mutable_constraint()->set_json_schema(
             R"({"type":"object","properties":{"a":{"type":"string",)"
             R"("pattern":"x"}}})");
       }),
       "json_schema: 'pattern' is not supported (at #/properties/a)"},
      {"a schema over 64 KiB", ValidRequestBut([](auto& r) {
         r.mutable_constraint()->set_json_schema(
             R"({"description":")" + std::string(70000, 'x') + R"("})");
       }),
       "json_schema: the schema is 70018 bytes; at most 65536"},
      {"a left-recursive grammar", ValidRequestBut([](auto& r) {
         r.mutable_constraint()->set_grammar("root ::= root \"a\" | \"b\"\n");
       }),
       "grammar: rule 'root' is left-recursive"},
      {"a constraint with no end-of-text token", ValidRequestBut([](auto& r) {
         r.set_ignore_eos(true);
         r.mutable_constraint()->set_json_object(true);
       }),
       "constraint: a constrained output ends with an end-of-text token"},
  };
}

TEST_F(InferenceServiceTest, BadRequestsAreRejectedAndServerKeepsServing) {
  std::vector<BadRequest> cases = BadRangeRequests();
  for (std::vector<BadRequest> more :
       {BadLimitRequests(), BadFitAndConstraintRequests()}) {
    for (BadRequest& c : more) cases.push_back(std::move(c));
  }
  ASSERT_GE(cases.size(), 20u);
  for (const BadRequest& c : cases) {
    const Streamed got = Call(c.req);
    EXPECT_EQ(got.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << c.name << ": " << got.status.error_message();
    EXPECT_NE(got.status.error_message().find(c.needle), std::string::npos)
        << c.name << ": " << got.status.error_message();
    EXPECT_TRUE(got.responses.empty()) << c.name;
    EXPECT_EQ(engine_->blocks().used_blocks(), 0) << c.name;
  }
  v1::GenerateRequest good;
  good.set_prompt("still here");
  good.set_max_tokens(5);
  good.set_ignore_eos(true);
  const Streamed after = Call(good);
  ASSERT_TRUE(after.status.ok()) << after.status.error_message();
  EXPECT_EQ(after.tokens.size(), 5u);
  EXPECT_EQ(engine_->blocks().used_blocks(), 0);
}

// Holds the scheduler's loop: a direct request whose first token waits
// until release() (callbacks run on the loop thread, so no step runs in
// between). Wait() returns once the loop is held.
class LoopHold {
 public:
  explicit LoopHold(Engine& engine) {
    std::shared_future<void> gate = release_.get_future().share();
    EXPECT_TRUE(engine
                    .Submit({.prompt = {1}, .max_tokens = 2},
                            {.on_token =
                                 [this, gate](int32_t, const TokenLogprobs*) {
                                   if (!held_) {
                                     held_ = true;
                                     holding_.set_value();
                                     gate.wait();
                                   }
                                   return TokenAction::kContinue;
                                 },
                             .on_done =
                                 [this](absl::StatusOr<GenerateResult>) {
                                   done_.set_value();
                                 }})
                    .ok());
  }
  void Wait() { holding_.get_future().wait(); }
  // Lets the loop go on, and waits until the holding request is done.
  void Release() {
    release_.set_value();
    done_.get_future().wait();
  }

 private:
  bool held_ = false;  // Loop thread only.
  std::promise<void> release_, holding_, done_;
};

// The server, not the client library, ends a cancelled stream: the
// request cannot finish by itself while the loop is held, and after the
// cancel it ends within a step or two (not after its 100 tokens), counted
// as cancelled, with its blocks back.
// Slows the scheduler's loop: a direct request (one block) whose every
// token waits `per_token` on the loop thread, so that other requests'
// tokens come at that pace while it runs. Its last token also waits for
// Release() (60 s at most), so the pacing lasts until the test has done
// what it needed a slow loop for, however loaded the machine: a fixed
// number of paced tokens ran out before the client did, under load.
class LoopPacer {
 public:
  LoopPacer(Engine& engine, int32_t tokens, absl::Duration per_token) {
    EXPECT_TRUE(engine
                    .Submit({.prompt = {1}, .max_tokens = tokens},
                            {.on_token =
                                 [this, tokens, per_token, n = 0](
                                     int32_t, const TokenLogprobs*) mutable {
                                   absl::SleepFor(per_token);
                                   if (++n == tokens) {
                                     release_.WaitForNotificationWithTimeout(
                                         absl::Seconds(60));
                                   }
                                   return TokenAction::kContinue;
                                 },
                             .on_done =
                                 [this](absl::StatusOr<GenerateResult>) {
                                   done_.Notify();
                                 }})
                    .ok());
  }
  // Lets the pacer's last token end (once).
  void Release() {
    if (!release_.HasBeenNotified()) release_.Notify();
  }
  ~LoopPacer() {
    Release();
    done_.WaitForNotification();
  }

 private:
  absl::Notification release_, done_;
};

TEST_F(InferenceServiceTest, CancelledStreamFreesItsBlocks) {
  // The tiny model decodes 100 tokens in milliseconds, faster than the
  // client reads two of them and holds the loop: paced at 40 ms a token
  // until the hold is queued (the pacer's block is the last free one, so
  // the hold is admitted as the pacer ends), the stream is still running
  // when held.
  LoopPacer pacer(*engine_, 12, absl::Milliseconds(40));
  v1::GenerateRequest req;
  req.set_prompt("a long one");  // 10 tokens + 100: 7 of the 8 blocks.
  req.set_max_tokens(100);
  req.set_ignore_eos(true);
  grpc::ClientContext ctx;
  auto reader = stub_->Generate(&ctx, req);
  v1::GenerateResponse r;
  ASSERT_TRUE(reader->Read(&r));
  ASSERT_TRUE(reader->Read(&r));
  LoopHold hold(*engine_);
  pacer.Release();
  hold.Wait();
  ASSERT_GT(engine_->stats().running, 1)  // The stream and the hold.
      << "the stream ended before the loop was held";
  const int64_t steps_held = engine_->stats().steps;
  const int64_t cancels = engine_->cancel_requests();
  ctx.TryCancel();
  while (reader->Read(&r)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_GT(engine_->stats().running, 0);  // Still running, server side.
  // The handler sees the cancel within its 50 ms poll, once gRPC has
  // delivered it (later on a loaded machine: 20 steps ran on under ASan
  // with two tests at once when the loop was released before). The bound
  // only keeps a failure from hanging.
  for (auto until = absl::Now() + absl::Seconds(10);
       engine_->cancel_requests() == cancels && absl::Now() < until;) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_GT(engine_->cancel_requests(), cancels)
      << "the server did not cancel the request";
  hold.Release();

  // The engine takes the cancel before its next step and frees the blocks
  // (the bound only keeps a failure from hanging).
  const auto deadline = absl::Now() + absl::Seconds(10);
  SchedulerStats st = engine_->stats();
  while ((st.running > 0 || st.device.used > 0) && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
    st = engine_->stats();
  }
  EXPECT_EQ(st.running, 0);
  EXPECT_EQ(st.device.used, 0);
  EXPECT_LT(st.steps - steps_held, 10) << "the stream ran on after its cancel";
  EXPECT_EQ(engine_->metrics().requests(RequestApi::kGrpc,
                                        RequestOutcome::kCancelled),
            1u);
  EXPECT_EQ(
      engine_->metrics().requests(RequestApi::kGrpc, RequestOutcome::kLength),
      0u);

  v1::GenerateRequest next;
  next.set_prompt("next");
  next.set_max_tokens(3);
  next.set_ignore_eos(true);
  const Streamed got = Call(next);
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  EXPECT_EQ(got.tokens.size(), 3u);
  EXPECT_EQ(engine_->blocks().used_blocks(), 0);
}

TEST_F(InferenceServiceTest, ConcurrentStreamsGetTheirOwnTokens) {
  v1::GenerateRequest req;
  req.set_prompt("same prompt");
  req.set_max_tokens(10);
  req.set_ignore_eos(true);
  const GenerateResult want =
      Direct(tokenizer_.Encode("same prompt"), 10, {}, {});
  std::vector<std::future<Streamed>> calls;
  for (int i = 0; i < 4; ++i) {
    calls.push_back(std::async(std::launch::async, [&] { return Call(req); }));
  }
  for (auto& c : calls) {
    const Streamed got = c.get();
    ASSERT_TRUE(got.status.ok()) << got.status.error_message();
    EXPECT_EQ(got.tokens, want.tokens);
  }
  EXPECT_EQ(engine_->blocks().used_blocks(), 0);
}

TEST_F(InferenceServiceTest, ConcurrentStreamsAreBatched) {
  v1::GenerateRequest req;
  req.set_prompt("ab");
  req.set_max_tokens(12);  // With the prompt: one block each, 8 fit.
  req.set_ignore_eos(true);
  int64_t before = engine_->steps();
  const Streamed one = Call(req);
  ASSERT_TRUE(one.status.ok()) << one.status.error_message();
  const int64_t one_steps = engine_->steps() - before;

  // A request that holds the loop on its first token while the streams
  // arrive, so that they start together.
  std::promise<void> release;
  std::shared_future<void> gate = release.get_future().share();
  std::promise<absl::StatusOr<GenerateResult>> gate_done;
  before = engine_->steps();
  std::promise<void> held;  // The loop is inside the gate's callback.
  std::atomic<bool> first{true};
  ASSERT_TRUE(
      engine_
          ->Submit({.prompt = {1}, .max_tokens = 2},
                   {.on_token =
                        [gate, &held, &first](int32_t, const TokenLogprobs*) {
                          if (first.exchange(false)) held.set_value();
                          gate.wait();
                          return TokenAction::kContinue;
                        },
                    .on_done =
                        [&](absl::StatusOr<GenerateResult> r) {
                          gate_done.set_value(std::move(r));
                        }})
          .ok());
  held.get_future().wait();
  std::vector<std::future<Streamed>> calls;
  for (int i = 0; i < 8; ++i) {
    calls.push_back(std::async(std::launch::async, [&] { return Call(req); }));
  }
  // All 8 wait behind the held loop before it goes on (a slow machine may
  // take a while to issue them).
  for (int i = 0; i < 3000 && engine_->waiting_requests() < 8; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(engine_->waiting_requests(), 8);
  release.set_value();
  for (auto& c : calls) {
    const Streamed got = c.get();
    ASSERT_TRUE(got.status.ok()) << got.status.error_message();
    EXPECT_EQ(got.tokens, one.tokens);
  }
  EXPECT_TRUE(gate_done.get_future().get().ok());
  const int64_t batched_steps = engine_->steps() - before;
  EXPECT_LT(batched_steps, 3 * one_steps) << one_steps;
  EXPECT_EQ(engine_->blocks().used_blocks(), 0);
}

// The server applies the client's deadline itself: the loop is held past
// it, so the request cannot finish in time, and the server ends it as
// DEADLINE_EXCEEDED (its own counter) instead of running its 100 tokens.
TEST_F(InferenceServiceTest, ClientDeadlineIsDeadlineExceeded) {
  v1::GenerateRequest req;
  req.set_prompt("slow");
  req.set_max_tokens(100);
  req.set_ignore_eos(true);
  LoopHold hold(*engine_);
  hold.Wait();
  const int64_t steps_held = engine_->stats().steps;
  grpc::ClientContext ctx;
  const auto deadline =
      std::chrono::system_clock::now() + std::chrono::seconds(2);
  ctx.set_deadline(deadline);
  auto reader = stub_->Generate(&ctx, req);
  // The request must reach the engine before its deadline (else the
  // client library ends it, and the server counts nothing): a short
  // deadline raced the request's arrival on a loaded machine. Queued
  // behind the held loop, it waits out the deadline there.
  for (auto until = absl::Now() + absl::Seconds(10);
       engine_->waiting_requests() == 0 && absl::Now() < until;) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  // EXPECT, not ASSERT: the loop must be released whatever happens.
  EXPECT_GT(engine_->waiting_requests(), 0) << "the request never arrived";
  EXPECT_LT(std::chrono::system_clock::now(), deadline)
      << "the request arrived after its deadline";
  std::this_thread::sleep_until(deadline + std::chrono::milliseconds(300));
  hold.Release();
  v1::GenerateResponse r;
  while (reader->Read(&r)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  // The server side ends within a step; its blocks come back (the bound
  // only keeps a failure from hanging: as in the cancel test above).
  const auto until = absl::Now() + absl::Seconds(10);
  while ((engine_->blocks().used_blocks() > 0 ||
          engine_->metrics().requests(RequestApi::kGrpc,
                                      RequestOutcome::kDeadline) == 0) &&
         absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(engine_->blocks().used_blocks(), 0);
  EXPECT_EQ(
      engine_->metrics().requests(RequestApi::kGrpc, RequestOutcome::kDeadline),
      1u);
  EXPECT_EQ(
      engine_->metrics().requests(RequestApi::kGrpc, RequestOutcome::kLength),
      0u);
  EXPECT_LT(engine_->stats().steps - steps_held, 10)
      << "the request ran on past its deadline";
}

TEST_F(InferenceServiceTest, TokenizeAndModelInfo) {
  grpc::ClientContext ctx;
  v1::TokenizeRequest treq;
  treq.set_text("<|im_start|>hé");
  v1::TokenizeResponse tres;
  ASSERT_TRUE(stub_->Tokenize(&ctx, treq, &tres).ok());
  EXPECT_EQ(
      std::vector<int32_t>(tres.token_ids().begin(), tres.token_ids().end()),
      tokenizer_.Encode("<|im_start|>hé"));
  EXPECT_EQ(tres.token_ids_size(), 3);

  grpc::ClientContext ctx2;
  v1::ModelInfo info;
  ASSERT_TRUE(stub_->GetModelInfo(&ctx2, {}, &info).ok());
  EXPECT_EQ(info.name(), "tiny");
  EXPECT_EQ(info.vocab_size(), kVocab);
  EXPECT_EQ(info.context_length(), 256);
  EXPECT_EQ(info.tp(), 1);
  EXPECT_EQ(info.pp(), 1);
  EXPECT_EQ(info.cp(), 1);
  EXPECT_EQ(info.kv_blocks(), kBlocks);
  EXPECT_EQ(info.block_size(), 16);
  EXPECT_EQ(info.host_kv_blocks(), 0);
  EXPECT_TRUE(info.prefix_caching());
}

// grpc.health.v1.Health/Check over raw bytes: the request {service: name}
// and the response {status: 1} (SERVING) are a few bytes of protobuf.
int HealthStatus(grpc::Channel* channel, const std::string& service) {
  grpc::GenericStub stub(channel->shared_from_this());
  std::string req;
  if (!service.empty()) {
    req = std::string(1, 0x0A) + static_cast<char>(service.size()) + service;
  }
  grpc::Slice slice(req);
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  grpc::ClientContext ctx;
  std::promise<grpc::Status> done;
  stub.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(),
                 &request, &response,
                 [&](grpc::Status s) { done.set_value(s); });
  const grpc::Status s = done.get_future().get();
  if (!s.ok()) return -static_cast<int>(s.error_code());
  std::vector<grpc::Slice> slices;
  if (!response.Dump(&slices).ok()) return -100;
  std::string bytes;
  for (const grpc::Slice& sl : slices) {
    bytes.append(reinterpret_cast<const char*>(sl.begin()), sl.size());
  }
  if (bytes.empty()) return 0;  // UNKNOWN, the default value.
  if (bytes.size() != 2 || bytes[0] != 0x08) return -101;
  return bytes[1];
}

TEST_F(InferenceServiceTest, HealthReportsServing) {
  EXPECT_EQ(HealthStatus(channel_.get(), ""), 1);
  EXPECT_EQ(HealthStatus(channel_.get(), "shardlm.v1.Inference"), 1);
}

// An in-process executor whose rank can be "lost" (Health() and Forward()
// fail with Unavailable), like a remote cluster's.
class LosableExecutor final : public StepExecutor {
 public:
  explicit LosableExecutor(std::unique_ptr<StepExecutor> inner)
      : inner_(std::move(inner)) {}
  const ModelConfig& config() const override { return inner_->config(); }
  int64_t num_kv_blocks() const override { return inner_->num_kv_blocks(); }
  DType kv_cache_dtype() const override { return inner_->kv_cache_dtype(); }
  int64_t weight_bytes() const override { return inner_->weight_bytes(); }
  absl::StatusOr<StepOutput> Forward(const StepInput& step) override {
    ++forwards;
    if (forward_fails) return absl::UnavailableError("worker rank 1 is gone");
    return inner_->Forward(step);
  }
  void Release(int64_t seq_id) override { inner_->Release(seq_id); }
  absl::Status Health() const override {
    if (lost) return absl::UnavailableError("worker rank 1 is gone");
    return absl::OkStatus();
  }
  std::atomic<bool> lost{false};
  std::atomic<bool> forward_fails{false};
  std::atomic<int> forwards{0};  // Forward calls, failed ones included.

 private:
  std::unique_ptr<StepExecutor> inner_;
};

TEST(ApiServerTest, LostRankIsUnavailableAndNotServing) {
  auto weights = RandomLlamaWeights(TinyConfig(), 7);
  auto inner = CreateInProcessExecutor(*weights, {});
  ASSERT_TRUE(inner.ok()) << inner.status();
  auto owned = std::make_unique<LosableExecutor>(std::move(*inner));
  LosableExecutor* executor = owned.get();
  EngineLeakCheck engines;  // Checked once the server below is gone.
  Engine* engine = engines.Keep(Engine::Create(std::move(owned), {}));
  ASSERT_NE(engine, nullptr);
  FakeTokenizer tok;
  auto server = ApiServer::Start(
      engine, &tok, {.health_poll = std::chrono::milliseconds(10)});
  ASSERT_TRUE(server.ok()) << server.status();
  auto channel =
      grpc::CreateChannel("127.0.0.1:" + std::to_string((*server)->port()),
                          grpc::InsecureChannelCredentials());
  auto stub = v1::Inference::NewStub(channel);
  const auto generate = [&] {
    v1::GenerateRequest req;
    req.set_prompt("hello");
    req.set_max_tokens(3);
    grpc::ClientContext ctx;
    auto reader = stub->Generate(&ctx, req);
    v1::GenerateResponse r;
    while (reader->Read(&r)) {
    }
    return reader->Finish();
  };
  const auto wait_for_health = [&](int want) {
    const auto until =
        std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (HealthStatus(channel.get(), "") != want &&
           std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return HealthStatus(channel.get(), "");
  };
  EXPECT_EQ(wait_for_health(1), 1);
  EXPECT_TRUE(generate().ok());

  // Lost between steps: the engine's Unavailable maps to UNAVAILABLE.
  executor->forward_fails = true;
  grpc::Status s = generate();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_NE(s.error_message().find("worker rank 1"), std::string::npos)
      << s.error_message();
  EXPECT_EQ(engine->blocks().used_blocks(), 0);

  // Known lost: NOT_SERVING (2), and requests fail before they start: with
  // steps able to succeed again, only the health check can refuse it, and
  // no step runs.
  executor->forward_fails = false;
  executor->lost = true;
  EXPECT_EQ(wait_for_health(2), 2);
  const int forwards = executor->forwards;
  s = generate();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_NE(s.error_message().find("worker rank 1"), std::string::npos);
  EXPECT_EQ(executor->forwards, forwards) << "a step ran for a refused request";

  // Back: SERVING again.
  executor->lost = false;
  EXPECT_EQ(wait_for_health(1), 1);
  EXPECT_TRUE(generate().ok());
}

// The state stream a router watches: load, and exactly the keys the prefix
// cache holds (inserted as prompts are computed, evicted as blocks are
// taken back), so that a router's index predicts the cache's hits.
TEST_F(InferenceServiceTest, WatchStatePublishesThePrefixCacheExactly) {
  // Keys only with --metrics-prefix-cache (they disclose prompts); the
  // fixture's server sends the load alone.
  {
    grpc::ClientContext ctx;
    auto reader = v1::ReplicaState::NewStub(channel_)->WatchState(
        &ctx, v1::WatchStateRequest());
    v1::ReplicaStateUpdate u;
    ASSERT_TRUE(reader->Read(&u));
    EXPECT_FALSE(u.publishes_keys());
    EXPECT_TRUE(u.ready());
    ctx.TryCancel();
  }
  auto keyed = ApiServer::Start(engine_, &tokenizer_,
                                {.listen_address = "127.0.0.1:0",
                                 .model_name = "tiny",
                                 .service = {.tp = 1, .pp = 1},
                                 .metrics_prefix_cache = true});
  ASSERT_TRUE(keyed.ok()) << keyed.status();
  auto state = v1::ReplicaState::NewStub(
      grpc::CreateChannel("127.0.0.1:" + std::to_string((*keyed)->port()),
                          grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  v1::WatchStateRequest wreq;
  wreq.set_interval_ms(5);
  auto reader = state->WatchState(&ctx, wreq);
  std::set<uint64_t> index;
  v1::ReplicaStateUpdate u;
  const auto read = [&] {
    if (!reader->Read(&u)) return false;
    if (u.reset()) index.clear();
    index.insert(u.inserted().begin(), u.inserted().end());
    for (uint64_t k : u.evicted()) {
      EXPECT_EQ(index.erase(k), 1u) << "evicted a key never inserted";
    }
    return true;
  };
  ASSERT_TRUE(read());
  EXPECT_TRUE(u.reset());
  EXPECT_TRUE(u.ready());
  EXPECT_EQ(u.block_size(), 16);
  EXPECT_EQ(u.kv_total_blocks(), kBlocks);
  EXPECT_TRUE(u.prefix_caching());
  EXPECT_TRUE(u.publishes_keys());
  EXPECT_TRUE(index.empty());
  // Reads until `done` holds; false after 10 s (heartbeats every 250 ms).
  const auto until = [&](const std::function<bool()>& done) {
    const absl::Time end = absl::Now() + absl::Seconds(10);
    while (!done()) {
      if (absl::Now() > end || !read()) return false;
    }
    return true;
  };

  std::vector<int32_t> first(40);  // 2 full blocks and 8 tokens.
  std::iota(first.begin(), first.end(), 1);
  v1::GenerateRequest req;
  req.mutable_prompt_token_ids()->Assign(first.begin(), first.end());
  req.set_max_tokens(4);
  req.set_ignore_eos(true);
  ASSERT_TRUE(Call(req).status.ok());
  const std::vector<uint64_t> first_keys = PrefixBlockKeys(first, 16);
  ASSERT_TRUE(until([&] { return index.size() == 2; }))
      << index.size() << " keys";
  EXPECT_EQ(index, std::set<uint64_t>(first_keys.begin(), first_keys.end()));

  // 100 tokens + 4 need 7 of the 8 blocks: 6 are free, so the older of the
  // two cached blocks (the first prompt's block 0) is taken back.
  std::vector<int32_t> second(100);
  std::iota(second.begin(), second.end(), 60);
  req.mutable_prompt_token_ids()->Assign(second.begin(), second.end());
  ASSERT_TRUE(Call(req).status.ok());
  ASSERT_TRUE(until([&] { return !index.contains(first_keys[0]); }));
  ASSERT_TRUE(until([&] { return index.size() == 7; })) << index.size();
  const std::vector<uint64_t> second_keys = PrefixBlockKeys(second, 16);
  for (uint64_t k : second_keys) EXPECT_TRUE(index.contains(k));
  EXPECT_TRUE(index.contains(first_keys[1]));  // Cached, though unreachable.
  ctx.TryCancel();
  (*keyed)->Shutdown();
}

TEST_F(InferenceServiceTest, WatchStateRefusesBadIntervals) {
  auto state = v1::ReplicaState::NewStub(channel_);
  grpc::ClientContext ctx;
  v1::WatchStateRequest wreq;
  wreq.set_interval_ms(2);
  auto reader = state->WatchState(&ctx, wreq);
  v1::ReplicaStateUpdate u;
  EXPECT_FALSE(reader->Read(&u));
  const grpc::Status s = reader->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("interval_ms"), std::string::npos);
}

TEST(ApiServerTest, UnusableAddressIsAnError) {
  auto weights = RandomLlamaWeights(TinyConfig(), 7);
  EngineLeakCheck engines;
  Engine* engine = engines.Keep(CreateLocalEngine(*weights, {.threads = 1}));
  ASSERT_NE(engine, nullptr);
  FakeTokenizer tok;
  auto server =
      ApiServer::Start(engine, &tok, {.listen_address = "not an address"});
  ASSERT_FALSE(server.ok());
  EXPECT_NE(std::string(server.status().message()).find("not an address"),
            std::string::npos);
}

}  // namespace
}  // namespace shardlm
