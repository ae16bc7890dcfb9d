// What shardlm renders for harmony tools where gpt-oss's template cannot be
// the reference (tests/reference/check_chat_template.py compares the rest
// with jinja2): a tool without a description, on which the template fails,
// and several calls in one message, of which it writes only the first.
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "model/chat_template.h"

namespace shardlm {
namespace {

// The literals by which a template is taken as harmony, with tools or not.
constexpr char kPlain[] =
    R"({{ "<|start|>system<|message|>" }}{{ "<|start|>user<|message|>" }})"
    R"({{ "<|start|>assistant<|channel|>final<|message|>" }})";
constexpr char kTools[] =
    R"({{ "} // namespace " }}{{ "<|start|>assistant to=" }})"
    R"({{ "<|channel|>commentary " }}{{ "<|call|>" }})"
    R"({{ " to=assistant<|channel|>commentary<|message|>" }})";

ChatTemplate Harmony(bool tools) {
  absl::StatusOr<ChatTemplate> t = ChatTemplate::FromSource(
      std::string(kPlain) + (tools ? kTools : ""), "<|startoftext|>",
      "<|return|>", /*vocab_has_chatml=*/false, absl::FromUnixSeconds(0));
  EXPECT_TRUE(t.ok()) << t.status();
  return *std::move(t);
}

TEST(ChatHarmony, ToolFormatFollowsTheTemplatesLiterals) {
  EXPECT_EQ(Harmony(true).tool_format(), ToolCallFormat::kHarmony);
  EXPECT_EQ(Harmony(false).tool_format(), ToolCallFormat::kNone);
  // Either way the output comes in channels.
  EXPECT_EQ(Harmony(false).output_format(), ToolCallFormat::kHarmony);
  const std::vector<ChatMessage> messages = {{"user", "q"}};
  const std::vector<ChatTool> tools = {{.name = "now"}};
  const absl::StatusOr<std::string> refused =
      Harmony(false).Render(messages, tools);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("renders tools"),
            std::string::npos);
}

TEST(ChatHarmony, ToolWithoutDescriptionHasNoCommentLine) {
  const std::vector<ChatMessage> messages = {{"user", "q"}};
  const std::vector<ChatTool> tools = {
      {.name = "now"},
      {.name = "add",
       .description = "Adds.",
       .parameters = R"({"type": "object", "properties":
                        {"a": {"type": "number"}}, "required": ["a"]})"}};
  const absl::StatusOr<std::string> out = Harmony(true).Render(messages, tools);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_NE(out->find("namespace functions {\n\ntype now = () => any;\n\n"
                      "// Adds.\ntype add = (_: {\na: number,\n}) => any;\n\n"
                      "} // namespace functions<|end|>"),
            std::string::npos)
      << *out;
}

TEST(ChatHarmony, SeveralCallsInOneMessageKeepTheirResultsNames) {
  ChatMessage calls{"assistant", ""};
  calls.tool_calls = {{.id = "c1", .name = "a", .arguments = R"({"x":1})"},
                      {.id = "c2", .name = "b", .arguments = "{}"}};
  std::vector<ChatMessage> messages = {{"user", "q"}, calls};
  messages.push_back({.role = "tool", .content = "rb", .tool_call_id = "c2"});
  messages.push_back({.role = "tool", .content = "ra", .tool_call_id = "c1"});
  // An id naming no call: the first call's, as the template takes it.
  messages.push_back({.role = "tool", .content = "r?", .tool_call_id = "c9"});
  const absl::StatusOr<std::string> out =
      Harmony(true).Render(messages, std::vector<ChatTool>{{.name = "a"}});
  ASSERT_TRUE(out.ok()) << out.status();
  const std::string want =
      "<|start|>user<|message|>q<|end|>"
      "<|start|>assistant to=functions.a<|channel|>commentary json"
      "<|message|>{\"x\": 1}<|call|>"
      "<|start|>assistant to=functions.b<|channel|>commentary json"
      "<|message|>{}<|call|>"
      "<|start|>functions.b to=assistant<|channel|>commentary<|message|>"
      "\"rb\"<|end|>"
      "<|start|>functions.a to=assistant<|channel|>commentary<|message|>"
      "\"ra\"<|end|>"
      "<|start|>functions.a to=assistant<|channel|>commentary<|message|>"
      "\"r?\"<|end|>"
      "<|start|>assistant";
  ASSERT_GE(out->size(), want.size());
  EXPECT_EQ(out->substr(out->size() - want.size()), want);
}

}  // namespace
}  // namespace shardlm
