// OpenAiApi pieces that the end-to-end check (tests/cli/check_http.py)
// cannot provoke on a healthy server: /ready failing when steps stall; and
// the exact shape of vLLM's prompt_logprobs from responses made by hand
// (end to end: tests/cli/check_openai_client.py).
#include "api/openai_api.h"

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "api/openai_protocol.h"
#include "engine/engine_leak_check.h"
#include "executor/in_process_executor.h"
#include "gtest/gtest.h"
#include "model/in_memory_weights.h"
#include "nlohmann/json.hpp"

namespace shardlm {
namespace {

ModelConfig Tiny() {
  ModelConfig c;
  c.n_layers = 1;
  c.hidden = 32;
  c.ffn_hidden = 64;
  c.n_heads = 2;
  c.n_kv_heads = 1;
  c.head_dim = 16;
  c.vocab_size = 50;
  c.context_length = 64;
  return c;
}

// Holds every step until released, as a frozen rank would.
class GatedExecutor : public StepExecutor {
 public:
  explicit GatedExecutor(std::unique_ptr<StepExecutor> inner)
      : inner_(std::move(inner)) {}
  const ModelConfig& config() const override { return inner_->config(); }
  int64_t num_kv_blocks() const override { return inner_->num_kv_blocks(); }
  DType kv_cache_dtype() const override { return inner_->kv_cache_dtype(); }
  int64_t weight_bytes() const override { return inner_->weight_bytes(); }
  absl::StatusOr<StepOutput> Forward(const StepInput& step) override {
    std::unique_lock<std::mutex> lock(mu_);
    entered_ = true;
    cv_.notify_all();
    cv_.wait(lock, [&] { return open_; });
    return inner_->Forward(step);
  }
  void WaitEntered() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return entered_; });
  }
  void Open() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    cv_.notify_all();
  }

 private:
  std::unique_ptr<StepExecutor> inner_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool entered_ = false, open_ = false;
};

// "speculative": false opts a request out of the server's speculative
// decoding; absent, the request may draft; another type is refused.
TEST(OpenAiWireTest, SpeculativeOptsOut) {
  const auto proto = [](const char* body, bool chat) {
    openai_wire::ResponseShape shape;
    const nlohmann::json j = nlohmann::json::parse(body);
    return openai_wire::ToProto(j, body, chat, "m", 256, &shape);
  };
  auto off = proto(R"({"prompt": "x", "speculative": false})", false);
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_TRUE(off->has_speculative());
  EXPECT_FALSE(off->speculative());
  auto chat = proto(
      R"({"messages": [{"role": "user", "content": "x"}], "speculative": false})",
      true);
  ASSERT_TRUE(chat.ok()) << chat.status();
  EXPECT_FALSE(chat->speculative());
  auto unset = proto(R"({"prompt": "x"})", false);
  ASSERT_TRUE(unset.ok());
  EXPECT_FALSE(unset->has_speculative());
  auto bad = proto(R"({"prompt": "x", "speculative": "no"})", false);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(OpenAiApiTest, ReadyFailsWhileRequestsWaitAndNoStepRuns) {
  auto weights = RandomLlamaWeights(Tiny(), 1);
  auto inner = CreateInProcessExecutor(*weights, {});
  ASSERT_TRUE(inner.ok()) << inner.status();
  auto gated = std::make_unique<GatedExecutor>(std::move(*inner));
  GatedExecutor* gate = gated.get();
  EngineLeakCheck engines;  // Checked once the service and API are gone.
  Engine* engine = engines.Keep(Engine::Create(std::move(gated), {}));
  ASSERT_NE(engine, nullptr);
  InferenceService service(engine, nullptr, "tiny", {});
  OpenAiApi api(
      engine, &service,
      {.model_name = "tiny", .stall_timeout = absl::Milliseconds(200)});
  EXPECT_TRUE(api.Ready().ok());  // Idle is ready.

  std::atomic<bool> done{false};
  std::thread client([&] {
    auto r = engine->Generate({.prompt = {1, 2, 3}, .max_tokens = 2});
    EXPECT_TRUE(r.ok()) << r.status();
    done = true;
  });
  gate->WaitEntered();
  // The first step is stuck; the engine's figures stay put.
  absl::Status ready;
  for (int i = 0; i < 100 && ready.ok(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    ready = api.Ready();
  }
  EXPECT_EQ(ready.code(), absl::StatusCode::kUnavailable) << ready;
  EXPECT_NE(ready.message().find("no step in"), absl::string_view::npos)
      << ready;
  gate->Open();
  client.join();
  EXPECT_TRUE(done);
  EXPECT_TRUE(api.Ready().ok()) << api.Ready();
}

class RecordedResponse final : public HttpResponse {
 public:
  bool Send(int s, const std::string&, const std::string& b) override {
    status = s;
    body = b;
    return true;
  }
  bool Start(int s, const std::string&) override {
    status = s;
    return true;
  }
  bool Write(const std::string& data) override {
    body += data;
    return true;
  }
  void AddHeader(std::string, std::string) override {}
  bool ClientGone() const override { return false; }

  int status = 0;
  std::string body;
};

RecordedResponse PostTo(OpenAiApi& api, const std::string& path,
                        const std::string& body) {
  HttpRequest req;
  req.method = "POST";
  req.path = path;
  req.body = body;
  RecordedResponse res;
  api.Handle(req, res);
  return res;
}

v1::TokenLogprob Lp(int32_t id, const char* text, float logprob) {
  v1::TokenLogprob t;
  t.set_token_id(id);
  t.set_text(text);
  t.set_logprob(logprob);
  return t;
}

// A service that answers every request with one response: the token "!"
// after a three-token prompt (ids 1, 7, 9) whose prompt logprobs it makes
// up: 7 is the second most likely at its position, 9 is not among the
// alternatives at its.
class PromptLogprobsTest : public ::testing::Test {
 protected:
  PromptLogprobsTest()
      : api_(
            [this](
                const v1::GenerateRequest& request, absl::Time,
                const std::function<bool()>&,
                const std::function<bool(const v1::GenerateResponse&)>& write,
                RequestApi) {
              seen_.push_back(request);
              v1::GenerateResponse r;
              r.set_text("!");
              r.add_token_ids(0);
              r.set_finish_reason("length");
              r.mutable_usage()->set_prompt_tokens(3);
              r.mutable_usage()->set_completion_tokens(1);
              if (request.prompt_logprobs() > 0) {
                *r.add_prompt_logprobs()->mutable_token() = Lp(1, "a", 0);
                v1::TokenLogprobs& second = *r.add_prompt_logprobs();
                *second.mutable_token() = Lp(7, " b", -1.5f);
                *second.add_top() = Lp(5, " c", -0.5f);
                *second.add_top() = Lp(7, " b", -1.5f);
                v1::TokenLogprobs& third = *r.add_prompt_logprobs();
                *third.mutable_token() = Lp(9, "d", -9);
                *third.add_top() = Lp(5, " c", -0.25f);
                *third.add_top() = Lp(6, "e", -2);
              }
              write(r);
              return absl::OkStatus();
            },
            /*context_length=*/64, {.model_name = "m"}) {}

  RecordedResponse Post(const std::string& path, const std::string& body) {
    return PostTo(api_, path, body);
  }

  std::vector<v1::GenerateRequest> seen_;
  OpenAiApi api_;
};

TEST_F(PromptLogprobsTest, CompletionsChoicesCarryVllmsFormat) {
  const RecordedResponse res =
      Post("/v1/completions", R"({"prompt": "a b d", "prompt_logprobs": 1})");
  ASSERT_EQ(res.status, 200) << res.body;
  ASSERT_EQ(seen_.size(), 1u);
  // All the alternatives, for the prompt token's rank.
  EXPECT_EQ(seen_[0].prompt_logprobs(), 20);
  const auto got = nlohmann::json::parse(res.body);
  const auto want = nlohmann::json::parse(R"([
      null,
      {"7": {"logprob": -1.5, "rank": 2, "decoded_token": " b"},
       "5": {"logprob": -0.5, "rank": 1, "decoded_token": " c"}},
      {"9": {"logprob": -9.0, "rank": null, "decoded_token": "d"},
       "5": {"logprob": -0.25, "rank": 1, "decoded_token": " c"}}])");
  EXPECT_EQ(got["choices"][0]["prompt_logprobs"], want) << res.body;
  EXPECT_FALSE(got.contains("prompt_logprobs"));
  // Without echo the text is the generated one only.
  EXPECT_EQ(got["choices"][0]["text"], "!");
}

TEST_F(PromptLogprobsTest, ZeroGivesThePromptTokensOnly) {
  const RecordedResponse res =
      Post("/v1/completions", R"({"prompt": "a b d", "prompt_logprobs": 0})");
  ASSERT_EQ(res.status, 200) << res.body;
  const auto lps =
      nlohmann::json::parse(res.body)["choices"][0]["prompt_logprobs"];
  ASSERT_EQ(lps.size(), 3u) << res.body;
  EXPECT_TRUE(lps[0].is_null());
  EXPECT_EQ(lps[1].size(), 1u);
  EXPECT_EQ(lps[1]["7"]["rank"], 2);
  EXPECT_EQ(lps[2].size(), 1u);
  EXPECT_TRUE(lps[2]["9"]["rank"].is_null());
}

TEST_F(PromptLogprobsTest, ChatHasThemBesideTheChoices) {
  const RecordedResponse res =
      Post("/v1/chat/completions",
           R"({"messages": [{"role": "user", "content": "hi"}],
               "prompt_logprobs": 2})");
  ASSERT_EQ(res.status, 200) << res.body;
  const auto got = nlohmann::json::parse(res.body);
  ASSERT_EQ(got["prompt_logprobs"].size(), 3u) << res.body;
  EXPECT_EQ(got["prompt_logprobs"][2].size(), 3u);  // 9, then 5 and 6.
  EXPECT_FALSE(got["choices"][0].contains("prompt_logprobs"));
}

TEST_F(PromptLogprobsTest, EchoAloneAddsNone) {
  const RecordedResponse res = Post(
      "/v1/completions", R"({"prompt": "a b d", "echo": true, "logprobs": 1})");
  ASSERT_EQ(res.status, 200) << res.body;
  ASSERT_EQ(seen_.size(), 1u);
  EXPECT_EQ(seen_[0].prompt_logprobs(), 1);
  const auto got = nlohmann::json::parse(res.body);
  EXPECT_FALSE(got["choices"][0].contains("prompt_logprobs")) << res.body;
  EXPECT_EQ(got["choices"][0]["text"], "a b d!");
  // The prompt's three tokens (the fake's "!" carries no logprobs).
  EXPECT_EQ(got["choices"][0]["logprobs"]["tokens"],
            nlohmann::json::parse(R"(["a", " b", "d"])"));
}

TEST_F(PromptLogprobsTest, RefusedOutsideTheRangeOrStreamed) {
  for (const char* body :
       {R"({"prompt": "x", "prompt_logprobs": 21})",
        R"({"prompt": "x", "prompt_logprobs": -1})",
        R"({"prompt": "x", "prompt_logprobs": 1e30})",
        R"({"prompt": "x", "prompt_logprobs": "2"})",
        R"({"prompt": "x", "prompt_logprobs": 1, "stream": true})"}) {
    const RecordedResponse res = Post("/v1/completions", body);
    EXPECT_EQ(res.status, 400) << body;
    EXPECT_NE(res.body.find("prompt_logprobs"), std::string::npos)
        << body << " -> " << res.body;
  }
  EXPECT_NE(Post("/v1/completions", R"({"prompt": "x", "prompt_logprobs": 21})")
                .body.find("prompt_logprobs must be in [0, 20], got 21"),
            std::string::npos);
  EXPECT_TRUE(seen_.empty());  // Nothing ran.
}

// A model that writes `pieces_`, served with `options`.
class ScriptedModelTest : public ::testing::Test {
 protected:
  explicit ScriptedModelTest(OpenAiApiOptions options)
      : api_(
            [this](
                const v1::GenerateRequest& request, absl::Time,
                const std::function<bool()>&,
                const std::function<bool(const v1::GenerateResponse&)>& write,
                RequestApi) {
              seen_.push_back(request);
              for (size_t i = 0; i < pieces_.size(); ++i) {
                v1::GenerateResponse r;
                r.set_text(pieces_[i]);
                if (i + 1 == pieces_.size()) {
                  r.set_finish_reason("stop");
                  r.mutable_usage()->set_prompt_tokens(3);
                  r.mutable_usage()->set_completion_tokens(4);
                }
                write(r);
              }
              return absl::OkStatus();
            },
            /*context_length=*/64, std::move(options)) {}

  RecordedResponse Post(const std::string& path, const std::string& body) {
    return PostTo(api_, path, body);
  }

  // A streamed chat's deltas, concatenated.
  struct Deltas {
    std::string content, reasoning;
  };
  static Deltas Concatenated(const std::string& body) {
    Deltas d;
    for (absl::string_view line : absl::StrSplit(body, "\n\n")) {
      if (!absl::ConsumePrefix(&line, "data: ") || line == "[DONE]") continue;
      const auto chunk = nlohmann::json::parse(line);
      for (const auto& choice : chunk["choices"]) {
        const auto& delta = choice["delta"];
        if (delta.contains("content")) d.content += delta["content"];
        if (delta.contains("reasoning_content")) {
          d.reasoning += delta["reasoning_content"];
        }
      }
    }
    return d;
  }

  // A chat's answer to "2+2?", streamed or not; `fields`: more request
  // fields, each followed by a comma.
  Deltas Answer(bool stream, const std::string& fields = "") {
    const RecordedResponse res = Post(
        "/v1/chat/completions",
        absl::StrCat(R"({"messages": [{"role": "user", "content": "2+2?"}], )",
                     fields, R"("stream": )", stream ? "true" : "false", "}"));
    EXPECT_EQ(res.status, 200) << res.body;
    if (res.status != 200) return {};
    if (stream) return Concatenated(res.body);
    const auto message =
        nlohmann::json::parse(res.body)["choices"][0]["message"];
    return {message.value("content", ""),
            message.value("reasoning_content", "")};
  }

  // What the model writes, in pieces.
  std::vector<std::string> pieces_ = {"<|channel|>analysis<|message|>Th",
                                      "ink.<|end|><|start|>assistant<|",
                                      "channel|>final<|message|>Hel", "lo"};
  std::vector<v1::GenerateRequest> seen_;
  OpenAiApi api_;
};

// gpt-oss's harmony: the analysis channel comes back as reasoning_content,
// the final channel as content, the markup in neither, streamed or not,
// whatever the pieces' cuts.
class HarmonyTest : public ScriptedModelTest {
 protected:
  HarmonyTest()
      : ScriptedModelTest({.model_name = "m",
                           .tool_call_format = ToolCallFormat::kHarmony}) {}
};

// Qwen3's <think> block: reasoning_content, then the answer.
class ThinkTest : public ScriptedModelTest {
 protected:
  ThinkTest()
      : ScriptedModelTest({.model_name = "m",
                           .tool_call_format = ToolCallFormat::kHermes,
                           .reasoning_format = ReasoningFormat::kThink}) {
    pieces_ = {"<thi", "nk>\nAdd them.\n</", "think>\n\n", "4"};
  }
};

TEST_F(ThinkTest, ReasoningApartStreamedOrNot) {
  for (bool stream : {false, true}) {
    const Deltas d = Answer(stream);
    EXPECT_EQ(d.content, "4") << stream;
    EXPECT_EQ(d.reasoning, "Add them.") << stream;
  }
  // Completions return the text as written.
  const RecordedResponse res = Post("/v1/completions", R"({"prompt": "q"})");
  ASSERT_EQ(res.status, 200) << res.body;
  EXPECT_EQ(nlohmann::json::parse(res.body)["choices"][0]["text"],
            "<think>\nAdd them.\n</think>\n\n4");
}

TEST_F(ThinkTest, EnableThinkingReachesTheTemplate) {
  RecordedResponse res = Post("/v1/chat/completions", R"({
      "messages": [{"role": "user", "content": "q"}],
      "chat_template_kwargs": {"enable_thinking": false}})");
  ASSERT_EQ(res.status, 200) << res.body;
  ASSERT_EQ(seen_.size(), 1u);
  EXPECT_TRUE(seen_[0].has_enable_thinking());
  EXPECT_FALSE(seen_[0].enable_thinking());
  res = Post("/v1/chat/completions",
             R"({"messages": [{"role": "user", "content": "q"}]})");
  ASSERT_EQ(seen_.size(), 2u);
  EXPECT_FALSE(seen_[1].has_enable_thinking());  // The template's default.
  // Refused: another key, another type, and on completions.
  for (const char* body : {R"({"messages": [{"role": "user", "content": "q"}],
            "chat_template_kwargs": {"tools_in_user_message": true}})",
                           R"({"messages": [{"role": "user", "content": "q"}],
            "chat_template_kwargs": {"enable_thinking": "no"}})",
                           R"({"messages": [{"role": "user", "content": "q"}],
            "chat_template_kwargs": []})"}) {
    res = Post("/v1/chat/completions", body);
    EXPECT_EQ(res.status, 400) << body;
    EXPECT_NE(res.body.find("chat_template_kwargs"), std::string::npos)
        << res.body;
  }
  res = Post("/v1/completions", R"({"prompt": "q",
      "chat_template_kwargs": {"enable_thinking": false}})");
  EXPECT_EQ(res.status, 400) << res.body;
  EXPECT_EQ(seen_.size(), 2u);  // No refused request ran.
}

// DeepSeek R1: the prompt opened <think>, so the output's text up to
// </think> is reasoning_content; V3.1's only when the request asks for it.
class PromptOpensThinkTest : public ScriptedModelTest {
 protected:
  explicit PromptOpensThinkTest(
      ReasoningFormat format = ReasoningFormat::kThinkOpen)
      : ScriptedModelTest({.model_name = "m", .reasoning_format = format}) {
    pieces_ = {"Add them.\n</th", "ink>\n\n", "4"};
  }
};

TEST_F(PromptOpensThinkTest, ReasoningApartStreamedOrNot) {
  for (bool stream : {false, true}) {
    const Deltas d = Answer(stream);
    EXPECT_EQ(d.content, "4") << stream;
    EXPECT_EQ(d.reasoning, "Add them.") << stream;
  }
}

class ThinkIfEnabledTest : public PromptOpensThinkTest {
 protected:
  ThinkIfEnabledTest()
      : PromptOpensThinkTest(ReasoningFormat::kThinkIfEnabled) {}
};

TEST_F(ThinkIfEnabledTest, ReasoningApartOnlyWhenEnabled) {
  for (bool stream : {false, true}) {
    Deltas d = Answer(stream,
                      R"("chat_template_kwargs": {"enable_thinking": true}, )");
    EXPECT_EQ(d.content, "4") << stream;
    EXPECT_EQ(d.reasoning, "Add them.") << stream;
    // Off (V3.1's default): the text is the answer as it came.
    d = Answer(stream);
    EXPECT_EQ(d.content, "Add them.\n</think>\n\n4") << stream;
    EXPECT_EQ(d.reasoning, "") << stream;
  }
}

TEST_F(HarmonyTest, ChatSplitsReasoningFromTheAnswer) {
  const RecordedResponse res =
      Post("/v1/chat/completions",
           R"({"messages": [{"role": "user", "content": "q"}]})");
  ASSERT_EQ(res.status, 200) << res.body;
  const auto got = nlohmann::json::parse(res.body);
  const auto& message = got["choices"][0]["message"];
  EXPECT_EQ(message["content"], "Hello") << res.body;
  EXPECT_EQ(message["reasoning_content"], "Think.") << res.body;
}

TEST_F(HarmonyTest, StreamedDeltasAddUpToTheSameMessage) {
  const RecordedResponse res = Post(
      "/v1/chat/completions",
      R"({"messages": [{"role": "user", "content": "q"}], "stream": true})");
  ASSERT_EQ(res.status, 200) << res.body;
  const Deltas d = Concatenated(res.body);
  EXPECT_EQ(d.content, "Hello") << res.body;
  EXPECT_EQ(d.reasoning, "Think.") << res.body;
  EXPECT_EQ(res.body.find("<|"), std::string::npos) << res.body;
}

TEST_F(HarmonyTest, StreamedCallIsAToolCallDelta) {
  pieces_ = {"<|channel|>analysis<|message|>Weather.<|end|><|start|>",
             "assistant<|channel|>commentary to=functions.get_weather <|con",
             "strain|>json<|message|>{\"city\":", "\"Oslo\"}<|call|>"};
  const RecordedResponse res = Post("/v1/chat/completions", R"({
      "messages": [{"role": "user", "content": "q"}], "stream": true,
      "tools": [{"type": "function", "function": {"name": "get_weather"}}]})");
  ASSERT_EQ(res.status, 200) << res.body;
  std::string content, reasoning, name, arguments;
  for (absl::string_view line : absl::StrSplit(res.body, "\n\n")) {
    if (!absl::ConsumePrefix(&line, "data: ") || line == "[DONE]") continue;
    const auto chunk = nlohmann::json::parse(line);
    for (const auto& choice : chunk["choices"]) {
      const auto& delta = choice["delta"];
      if (delta.contains("content")) content += delta["content"];
      if (delta.contains("reasoning_content")) {
        reasoning += delta["reasoning_content"];
      }
      if (!delta.contains("tool_calls")) continue;
      for (const auto& call : delta["tool_calls"]) {
        EXPECT_EQ(call["index"], 0) << res.body;
        if (call["function"].contains("name")) name += call["function"]["name"];
        arguments += call["function"]["arguments"];
      }
    }
  }
  EXPECT_EQ(content, "") << res.body;
  EXPECT_EQ(reasoning, "Weather.") << res.body;
  EXPECT_EQ(name, "get_weather") << res.body;
  EXPECT_EQ(arguments, R"({"city": "Oslo"})") << res.body;
  EXPECT_EQ(res.body.find("<|"), std::string::npos) << res.body;
}

TEST_F(HarmonyTest, ReasoningEffortReachesTheTemplate) {
  RecordedResponse res =
      Post("/v1/chat/completions",
           R"({"messages": [{"role": "user", "content": "q"}],
                                  "reasoning_effort": "high"})");
  ASSERT_EQ(res.status, 200) << res.body;
  ASSERT_EQ(seen_.size(), 1u);
  EXPECT_EQ(seen_[0].reasoning_effort(), "high");
  res = Post("/v1/chat/completions",
             R"({"messages": [{"role": "user", "content": "q"}],
                 "reasoning_effort": 3})");
  EXPECT_EQ(res.status, 400) << res.body;
  EXPECT_NE(res.body.find("reasoning_effort"), std::string::npos) << res.body;
  res =
      Post("/v1/completions", R"({"prompt": "q", "reasoning_effort": "high"})");
  EXPECT_EQ(res.status, 400) << res.body;
  EXPECT_EQ(seen_.size(), 1u);  // Neither refused request ran.
}

TEST_F(HarmonyTest, CompletionsKeepTheRawText) {
  const RecordedResponse res =
      Post("/v1/completions", R"({"prompt": "<|start|>user"})");
  ASSERT_EQ(res.status, 200) << res.body;
  const auto got = nlohmann::json::parse(res.body);
  EXPECT_EQ(got["choices"][0]["text"],
            "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant"
            "<|channel|>final<|message|>Hello");
}

}  // namespace
}  // namespace shardlm
