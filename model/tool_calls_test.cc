#include "model/tool_calls.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "model/chat_json.h"

namespace shardlm {
namespace {

// Feeds `text` in pieces of `step` bytes and gathers what came out.
ToolCallEvents Feed(std::string_view text, size_t step,
                    std::vector<std::string> names = {"get_weather", "add"},
                    ToolCallFormat format = ToolCallFormat::kHermes) {
  ToolCallStream stream(std::move(names), format);
  ToolCallEvents all;
  const auto take = [&](ToolCallEvents e) {
    all.content += e.content;
    for (ChatToolCall& c : e.calls) all.calls.push_back(std::move(c));
  };
  for (size_t i = 0; i < text.size(); i += step) {
    take(stream.Push(text.substr(i, step)));
  }
  take(stream.Finish());
  return all;
}

TEST(ToolCallStream, PlainTextPassesThrough) {
  for (size_t step : {1, 3, 100}) {
    const ToolCallEvents e = Feed("Hello <tool a tag-like < text", step);
    EXPECT_EQ(e.content, "Hello <tool a tag-like < text");
    EXPECT_TRUE(e.calls.empty());
  }
}

TEST(ToolCallStream, ContentThenTwoCalls) {
  const std::string text =
      "Let me check.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
      "{\"city\":\"Paris\",\"unit\":\"c\"}}\n</tool_call>\n<tool_call>\n"
      "{\"name\": \"add\", \"arguments\": {\"b\": 2, \"a\": [1.5, true]}}\n"
      "</tool_call>\n";
  for (size_t step : {1, 2, 7, 1000}) {
    const ToolCallEvents e = Feed(text, step);
    EXPECT_EQ(e.content, "Let me check.") << step;
    ASSERT_EQ(e.calls.size(), 2u) << step;
    EXPECT_EQ(e.calls[0].name, "get_weather");
    // Python's json.dumps layout, keys in the model's order.
    EXPECT_EQ(e.calls[0].arguments, R"({"city": "Paris", "unit": "c"})");
    EXPECT_EQ(e.calls[1].name, "add");
    EXPECT_EQ(e.calls[1].arguments, R"({"b": 2, "a": [1.5, true]})");
  }
}

TEST(ToolCallStream, MalformedCallsComeBackAsContent) {
  const std::vector<std::string> malformed = {
      // Not JSON.
      "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": }\n</tool_call>",
      // A function that was not offered.
      "<tool_call>\n{\"name\": \"rm\", \"arguments\": {}}\n</tool_call>",
      // Arguments not an object.
      "<tool_call>\n{\"name\": \"add\", \"arguments\": \"{}\"}\n</tool_call>",
      // Left open at the end.
      "<tool_call>\n{\"name\": \"add\", \"arguments\": {}}",
      // A part of the tag at the end.
      "<tool_ca",
      // Extra keys.
      "<tool_call>{\"name\": \"add\", \"arguments\": {}, \"x\": 1}</tool_call>",
  };
  for (const std::string& text : malformed) {
    for (size_t step : {1, 5, 1000}) {
      const ToolCallEvents e = Feed("Hi " + text, step);
      EXPECT_EQ(e.content, "Hi " + text) << step;
      EXPECT_TRUE(e.calls.empty()) << text;
    }
  }
}

TEST(ToolCallStream, TextAfterAValidCallIsContentFromThere) {
  const std::string call =
      "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1}}\n"
      "</tool_call>";
  const ToolCallEvents e = Feed(call + " and then some words", 4);
  ASSERT_EQ(e.calls.size(), 1u);
  EXPECT_EQ(e.calls[0].arguments, R"({"a": 1})");
  EXPECT_EQ(e.content, " and then some words");
}

ToolCallEvents FeedLlama(std::string_view text, size_t step) {
  return Feed(text, step, {"get_weather", "add"}, ToolCallFormat::kLlamaJson);
}

TEST(ToolCallStreamLlama, WholeOutputCallsAreParsed) {
  const std::string one =
      " {\"name\": \"add\", \"parameters\": {\"a\":1, \"b\": \"}{;\"}}";
  const std::string two =
      "<|python_tag|>{\"name\": \"get_weather\", \"arguments\": "
      "{\"city\": \"Oslo\"}}; {\"name\": \"add\", \"parameters\": {}}\n";
  for (size_t step : {1, 3, 1000}) {
    ToolCallEvents e = FeedLlama(one, step);
    EXPECT_EQ(e.content, "") << step;
    ASSERT_EQ(e.calls.size(), 1u) << step;
    EXPECT_EQ(e.calls[0].name, "add");
    EXPECT_EQ(e.calls[0].arguments, R"({"a": 1, "b": "}{;"})");
    e = FeedLlama(two, step);
    EXPECT_EQ(e.content, "") << step;
    ASSERT_EQ(e.calls.size(), 2u) << step;
    EXPECT_EQ(e.calls[0].name, "get_weather");
    EXPECT_EQ(e.calls[0].arguments, R"({"city": "Oslo"})");
    EXPECT_EQ(e.calls[1].arguments, "{}");
  }
}

TEST(ToolCallStreamLlama, TextAndMalformedCallsAreContent) {
  const std::vector<std::string> outputs = {
      "The weather is fine. {\"name\": \"add\", \"parameters\": {}}",
      "<|python",
      "<|python_tag|>print(1)",
      "{\"name\": \"rm\", \"parameters\": {}}",             // Not offered.
      "{\"name\": \"add\", \"parameters\": [1]}",           // Not an object.
      "{\"name\": \"add\", \"parameters\": {}, \"x\": 1}",  // Extra key.
      "{\"name\": \"add\", \"parameters\": {\"a\": 1}",     // Left open.
      "{\"name\": \"add\", \"parameters\": {}} and more",
      "{\"name\": \"add\", \"parameters\": {}};",
  };
  for (const std::string& text : outputs) {
    for (size_t step : {1, 4, 1000}) {
      const ToolCallEvents e = FeedLlama(text, step);
      EXPECT_EQ(e.content, text) << step;
      EXPECT_TRUE(e.calls.empty()) << text;
    }
  }
}

TEST(ToolCallStreamLlama, PlainTextStreamsAtOnce) {
  ToolCallStream stream({"add"}, ToolCallFormat::kLlamaJson);
  EXPECT_EQ(stream.Push("  ").content, "");
  EXPECT_EQ(stream.Push("Hi").content, "  Hi");
  EXPECT_EQ(stream.Push(" {").content, " {");
  EXPECT_EQ(stream.Finish().content, "");
}

// `text` pushed in pieces cut at `cuts` (offsets), then Finish; what every
// event said, concatenated.
ToolCallEvents Feed(const std::string& text, const std::vector<size_t>& cuts,
                    std::vector<std::string> names, ToolCallFormat format,
                    ReasoningFormat reasoning = ReasoningFormat::kNone) {
  ToolCallStream stream(std::move(names), format, reasoning);
  ToolCallEvents all;
  size_t at = 0;
  const auto take = [&](const ToolCallEvents& e) {
    all.content += e.content;
    all.reasoning += e.reasoning;
    all.calls.insert(all.calls.end(), e.calls.begin(), e.calls.end());
  };
  for (size_t cut : cuts) {
    take(stream.Push(std::string_view(text).substr(at, cut - at)));
    at = cut;
  }
  take(stream.Push(std::string_view(text).substr(at)));
  take(stream.Finish());
  return all;
}

// Harmony (gpt-oss).
ToolCallEvents FeedHarmony(const std::string& text,
                           const std::vector<size_t>& cuts,
                           std::vector<std::string> names = {}) {
  return Feed(text, cuts, std::move(names), ToolCallFormat::kHarmony);
}

// "name arguments" of each call.
std::vector<std::string> CallTexts(const ToolCallEvents& e) {
  std::vector<std::string> calls;
  for (const ChatToolCall& call : e.calls) {
    calls.push_back(call.name + " " + call.arguments);
  }
  return calls;
}

// Qwen3's <think> block: the expected splits are its template's own,
// content.split('</think>')[0].rstrip('\n').split('<think>')[-1]
// .lstrip('\n') and the rest .lstrip('\n'), for answers with one block.
TEST(ToolCallStreamThink, ReasoningSplitsAtEveryCut) {
  struct Case {
    std::string output, reasoning, content;
    std::vector<std::string> calls;
  };
  const std::vector<Case> cases = {
      {"<think>\nLet me add.\n</think>\n\n4", "Let me add.", "4", {}},
      {"<think>\n\n</think>\n\nHi", "", "Hi", {}},
      {"<think>\n a\n\n b \n</think>\n\n\n c\n", " a\n\n b ", " c\n", {}},
      {"<think>a <tool_call> b</think>c", "a <tool_call> b", "c", {}},
      {"<think>x</think>\n\n", "x", "", {}},
      // GLM-4.5 writes a newline first.
      {"\n<think>Add.</think>\n4", "Add.", "4", {}},
      {"\n\n", "", "\n\n", {}},
      {"\nNo think\n", "", "\nNo think\n", {}},
      // The calls after the reasoning are parsed as without it.
      {"<think>\nneed f\n</think>\n\n<tool_call>\n{\"name\": \"f\", "
       "\"arguments\": {\"a\":1}}\n</tool_call>",
       "need f",
       "",
       {R"(f {"a": 1})"}},
      // Not opened by <think>: all is the answer.
      {"No think here\n", "", "No think here\n", {}},
      {" <think>x</think>", "", " <think>x</think>", {}},
      {"<thi", "", "<thi", {}},
      {"", "", "", {}},
      // Left open (max_tokens): all of it is reasoning.
      {"<think>\nunclosed\n", "unclosed\n", "", {}},
      {"<think>x\n\n</thinkY", "x\n\n</thinkY", "", {}},
      {"<think>\n\n", "", "", {}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.output);
    for (size_t i = 0; i <= c.output.size(); ++i) {
      for (size_t j = i; j <= c.output.size(); j += 2) {
        const ToolCallEvents e =
            Feed(c.output, {i, j}, {"f"}, ToolCallFormat::kHermes,
                 ReasoningFormat::kThink);
        ASSERT_EQ(e.reasoning, c.reasoning) << i << " " << j;
        ASSERT_EQ(e.content, c.content) << i << " " << j;
        ASSERT_EQ(CallTexts(e), c.calls) << i << " " << j;
      }
    }
  }
}

TEST(ToolCallStreamThink, ReasoningStreamsAsItComes) {
  ToolCallStream stream({}, ToolCallFormat::kHermes, ReasoningFormat::kThink);
  EXPECT_EQ(stream.Push("<think>\nStep").reasoning, "Step");
  // Newlines and a part of </think> are held: they may end it.
  EXPECT_EQ(stream.Push(" one.\n</th").reasoning, " one.");
  ToolCallEvents e = stream.Push("ink>\n\nFour");
  EXPECT_EQ(e.reasoning, "");
  EXPECT_EQ(e.content, "Four");
}

// DeepSeek R1: the prompt opened <think>, so the output is reasoning from
// its first byte until </think>; V3.1's format, resolved per request.
TEST(ToolCallStreamThink, PromptOpenedBlockSplitsAtEveryCut) {
  struct Case {
    std::string output, reasoning, content;
  };
  const std::vector<Case> cases = {
      {"Let me add.\n</think>\n\n4", "Let me add.", "4"},
      {"\nOkay, 2+2.\n\n</think>\n\nIt is 4.\n", "Okay, 2+2.", "It is 4.\n"},
      {"</think>\n\nHi", "", "Hi"},
      {"a <think> b</think>c", "a <think> b", "c"},
      // Never closed (max_tokens): all of it is reasoning.
      {"still thinking\n", "still thinking\n", ""},
      {"x</thin", "x</thin", ""},
      {"", "", ""},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.output);
    for (size_t i = 0; i <= c.output.size(); ++i) {
      for (size_t j = i; j <= c.output.size(); j += 2) {
        const ToolCallEvents e =
            Feed(c.output, {i, j}, {}, ToolCallFormat::kHermes,
                 ReasoningFormat::kThinkOpen);
        ASSERT_EQ(e.reasoning, c.reasoning) << i << " " << j;
        ASSERT_EQ(e.content, c.content) << i << " " << j;
      }
    }
  }
  EXPECT_EQ(RequestReasoningFormat(ReasoningFormat::kThinkIfEnabled, true),
            ReasoningFormat::kThinkOpen);
  EXPECT_EQ(RequestReasoningFormat(ReasoningFormat::kThinkIfEnabled, false),
            ReasoningFormat::kNone);
  EXPECT_EQ(
      RequestReasoningFormat(ReasoningFormat::kThinkIfEnabled, std::nullopt),
      ReasoningFormat::kNone);
  EXPECT_EQ(RequestReasoningFormat(ReasoningFormat::kThink, false),
            ReasoningFormat::kThink);
  for (ReasoningFormat f :
       {ReasoningFormat::kNone, ReasoningFormat::kThink,
        ReasoningFormat::kThinkOpen, ReasoningFormat::kThinkIfEnabled}) {
    EXPECT_EQ(ReasoningFormatFromName(ReasoningFormatName(f)), f);
  }
}

TEST(ToolCallStreamHarmony, ChannelsSplitAtEveryCut) {
  struct Case {
    std::string output, reasoning, content;
  };
  const std::vector<Case> cases = {
      {"<|channel|>analysis<|message|>User asks 2+2. Easy.<|end|>"
       "<|start|>assistant<|channel|>final<|message|>2 + 2 = 4.",
       "User asks 2+2. Easy.", "2 + 2 = 4."},
      // A preamble on the commentary channel is content; the answer's
      // <|return|> (when the stop token is kept) ends it.
      {"<|channel|>analysis<|message|>a<|end|><|start|>assistant<|channel|>"
       "commentary<|message|>Let me think.<|end|><|start|>assistant"
       "<|channel|>final<|message|>b<|return|>",
       "a", "Let me think.b"},
      // Cut off by max_tokens inside the reasoning.
      {"<|channel|>analysis<|message|>Still thinking <|", "Still thinking <|",
       ""},
      // Text that looks like markup but is not a tag stays text.
      {"<|channel|>final<|message|>a <|en b <|end c", "", "a <|en b <|end c"},
      // Not harmony at all: content as it came.
      {"Plain answer <|end|>", "", "Plain answer <|end|>"},
      {"", "", ""},
      // A header the output ended in is content, not lost.
      {"<|channel|>analysis<|message|>x<|end|><|start|>assistant", "x",
       "<|start|>assistant"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.output);
    const ToolCallEvents whole = FeedHarmony(c.output, {});
    EXPECT_EQ(whole.reasoning, c.reasoning);
    EXPECT_EQ(whole.content, c.content);
    // Streamed: cut once and twice anywhere, the same text.
    for (size_t i = 0; i <= c.output.size(); ++i) {
      for (size_t j = i; j <= c.output.size(); j += 3) {
        const ToolCallEvents e = FeedHarmony(c.output, {i, j});
        ASSERT_EQ(e.reasoning, c.reasoning) << i << " " << j;
        ASSERT_EQ(e.content, c.content) << i << " " << j;
      }
    }
  }
}

TEST(ToolCallStreamHarmony, TextStreamsAsItComes) {
  ToolCallStream stream({}, ToolCallFormat::kHarmony);
  ToolCallEvents e = stream.Push("<|channel|>analysis<|message|>Think");
  EXPECT_EQ(e.reasoning, "Think");
  e = stream.Push(" more<|");  // "<|" may begin <|end|>: held.
  EXPECT_EQ(e.reasoning, " more");
  e = stream.Push("end|><|start|>assistant<|channel|>final<|message|>Hi");
  EXPECT_EQ(e.reasoning, "");
  EXPECT_EQ(e.content, "Hi");
  e = stream.Finish();
  EXPECT_EQ(e.content, "");
  EXPECT_EQ(e.reasoning, "");
}

TEST(ToolCallStreamHarmony, CallsToOfferedFunctionsAtEveryCut) {
  struct Case {
    std::string output, reasoning, content;
    std::vector<std::string> calls;  // "name arguments".
  };
  const std::vector<Case> cases = {
      // The recipient in the role, going on from the prompt's
      // <|start|>assistant; the arguments as Python writes them.
      {" to=functions.get_weather<|channel|>commentary json<|message|>"
       "{\"city\":\"Paris\",\"n\":[1,2]}<|call|>",
       "",
       "",
       {R"(get_weather {"city": "Paris", "n": [1, 2]})"}},
      // After reasoning, the recipient after the channel, <|constrain|>.
      {"<|channel|>analysis<|message|>Need it.<|end|><|start|>assistant"
       "<|channel|>commentary to=functions.get_weather <|constrain|>json"
       "<|message|>{\"city\": \"Oslo\"}<|call|>",
       "Need it.",
       "",
       {R"(get_weather {"city": "Oslo"})"}},
      // A function not offered: its text is content.
      {"<|channel|>commentary to=functions.nope <|constrain|>json<|message|>"
       "{}<|call|>",
       "",
       "{}",
       {}},
      // Arguments that are not a JSON object, or cut off: content.
      {"<|channel|>commentary to=functions.get_weather<|message|>[1]<|call|>",
       "",
       "[1]",
       {}},
      {" to=functions.get_weather<|channel|>commentary json<|message|>"
       "{\"city\": \"Pa",
       "",
       "{\"city\": \"Pa",
       {}},
      // " to=" opens only the first header.
      {"<|channel|>final<|message|>a<|end|> to=functions.get_weather"
       "<|channel|>commentary<|message|>{}<|call|>",
       "",
       "a to=functions.get_weather<|channel|>commentary<|message|>{}<|call|>",
       {}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.output);
    for (size_t i = 0; i <= c.output.size(); ++i) {
      for (size_t j = i; j <= c.output.size(); j += 5) {
        const ToolCallEvents e = FeedHarmony(c.output, {i, j}, {"get_weather"});
        ASSERT_EQ(e.reasoning, c.reasoning) << i << " " << j;
        ASSERT_EQ(e.content, c.content) << i << " " << j;
        ASSERT_EQ(CallTexts(e), c.calls) << i << " " << j;
      }
    }
  }
}

TEST(PythonJsonDumps, MatchesPythonLayout) {
  // json.dumps(json.loads(s), ensure_ascii=False) for each, by hand.
  EXPECT_EQ(*PythonJsonDumps(R"({"b":1,"a":{"x":[1,2,{}],"y":[]}})"),
            R"({"b": 1, "a": {"x": [1, 2, {}], "y": []}})");
  EXPECT_EQ(*PythonJsonDumps("\"\\u00e9\\n\\u0001\\\"\""),
            "\"\xc3\xa9\\n\\u0001\\\"\"");
  EXPECT_EQ(*PythonJsonDumps("[0.5, -3, 1e-07, null, false]"),
            "[0.5, -3, 1e-07, null, false]");
  EXPECT_FALSE(PythonJsonDumps("{").ok());
}

}  // namespace
}  // namespace shardlm
