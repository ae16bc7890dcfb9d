#include "api/messages_api.h"

#include <string>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace shardlm {
namespace {

using Json = nlohmann::json;
using Ordered = nlohmann::ordered_json;

Ordered Chat(const std::string& body) {
  absl::StatusOr<std::string> chat = MessagesToChatBody(body);
  EXPECT_TRUE(chat.ok()) << chat.status();
  return chat.ok() ? Ordered::parse(*chat) : Ordered();
}

void ExpectRefused(const std::string& body, const std::string& what) {
  absl::StatusOr<std::string> chat = MessagesToChatBody(body);
  ASSERT_FALSE(chat.ok()) << body;
  EXPECT_EQ(chat.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(chat.status().message()).find(what), std::string::npos)
      << chat.status();
}

// A conversation with a system prompt, a tool, a call and its result
// becomes the chat request a client of /v1/chat/completions would send.
TEST(MessagesApiTest, AConversationWithToolsBecomesItsChatRequest) {
  const Ordered chat = Chat(R"({
    "model": "m", "max_tokens": 64, "system": "Be brief.",
    "stop_sequences": ["\n\n"], "temperature": 0, "top_k": 5,
    "tools": [{"name": "get_weather", "description": "Weather.",
               "input_schema": {"type": "object",
                                "properties": {"z": {"type": "string"},
                                               "a": {"type": "string"}}}}],
    "tool_choice": {"type": "tool", "name": "get_weather"},
    "messages": [
      {"role": "user", "content": "Weather in Paris?"},
      {"role": "assistant", "content": [
         {"type": "thinking", "thinking": "...", "signature": "x"},
         {"type": "text", "text": "Let me look."},
         {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
          "input": {"z": "Paris"}}]},
      {"role": "user", "content": [
         {"type": "tool_result", "tool_use_id": "toolu_1",
          "content": [{"type": "text", "text": "sunny"}]},
         {"type": "text", "text": "And tomorrow?"}]}]})");
  const Ordered want = Ordered::parse(R"({
    "model": "m", "max_tokens": 64, "stop": ["\n\n"], "temperature": 0,
    "top_k": 5,
    "tools": [{"type": "function", "function": {
        "name": "get_weather", "description": "Weather.",
        "parameters": {"type": "object",
                       "properties": {"z": {"type": "string"},
                                      "a": {"type": "string"}}}}}],
    "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
    "messages": [
      {"role": "system", "content": "Be brief."},
      {"role": "user", "content": "Weather in Paris?"},
      {"role": "assistant", "content": "Let me look.", "tool_calls": [
         {"id": "toolu_1", "type": "function",
          "function": {"name": "get_weather",
                       "arguments": "{\"z\":\"Paris\"}"}}]},
      {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"},
      {"role": "user", "content": "And tomorrow?"}]})");
  EXPECT_EQ(chat, want) << chat.dump(2);
  // The schema's properties keep the client's order (z before a).
  EXPECT_LT(chat.dump().find("\"z\""), chat.dump().find("\"a\""));
}

TEST(MessagesApiTest, ToolChoiceAndThinkingMapToTheirChatForms) {
  const std::string head =
      R"({"max_tokens": 8, "messages": [{"role": "user", "content": "hi"}], )";
  EXPECT_EQ(Chat(head + R"("tool_choice": {"type": "any"}})")["tool_choice"],
            "required");
  EXPECT_EQ(Chat(head + R"("tool_choice": {"type": "auto"}})")["tool_choice"],
            "auto");
  EXPECT_EQ(Chat(head + R"("tool_choice": {"type": "none"}})")["tool_choice"],
            "none");
  EXPECT_EQ(Chat(head + R"("thinking": {"type": "enabled",
                                         "budget_tokens": 1024}})")
                ["chat_template_kwargs"]["enable_thinking"],
            true);
  EXPECT_EQ(
      Chat(head + R"("metadata": {"user_id": "u"}})").contains("metadata"),
      false);
}

TEST(MessagesApiTest, WhatTheChatPathCannotCarryIsRefusedByName) {
  const std::string user = R"("messages": [{"role": "user", "content": )";
  ExpectRefused(R"({"messages": [{"role": "user", "content": "hi"}]})",
                "'max_tokens' is required");
  ExpectRefused(R"({"max_tokens": 8})", "'messages' is required");
  ExpectRefused(R"({"max_tokens": 8, "messages": []})", "non-empty");
  ExpectRefused(R"({"max_tokens": 8, )" + user +
                    R"([{"type": "image", "source": {}}]}]})",
                "content block type 'image'");
  ExpectRefused(R"({"max_tokens": 8, "messages": [{"role": "system",
                    "content": "x"}]})",
                "'messages[0].role' must be 'user' or 'assistant'");
  ExpectRefused(R"({"max_tokens": 8, )" + user +
                    R"([{"type": "tool_use", "id": "a", "name": "f",
                         "input": {}}]}]})",
                "not supported in a user message");
  ExpectRefused(R"({"max_tokens": 8, )" + user + R"("hi"}],
                    "tools": [{"type": "web_search_20250305",
                               "name": "web_search"}]})",
                "server tools");
  ExpectRefused(R"({"max_tokens": 8, )" + user + R"("hi"}],
                    "tools": [{"name": "f"}]})",
                "'tools[0].input_schema' must be an object");
  ExpectRefused(R"({"max_tokens": 8, )" + user + R"("hi"}],
                    "tool_choice": {"type": "some"}})",
                "'tool_choice.type'");
  ExpectRefused(R"({"max_tokens": 8, )" + user + R"("hi"}], "n": 2})",
                "'n' is not supported");
  ExpectRefused("[1]", "not a JSON object");
}

// The blocks a generation's pieces make, and the events that build them:
// replayed in order, the events give the same content.
TEST(MessagesApiTest, StreamEventsAssembleIntoTheMessage) {
  MessageBlocks blocks("toolu_x_");
  MessageBlocks::Events events;
  const auto push = [&](ToolCallEvents e) {
    for (auto& ev : blocks.Push(e)) events.push_back(std::move(ev));
  };
  push({.reasoning = "Think"});
  push({.reasoning = "ing."});
  push({.content = "Hello"});
  push({.content = " world",
        .calls = {{.name = "f", .arguments = R"({"a": 1})"}}});
  push({.calls = {{.name = "g", .arguments = "{}"}}});
  for (auto& ev : blocks.Finish()) events.push_back(std::move(ev));
  const Json want = Json::parse(R"([
    {"type": "thinking", "thinking": "Thinking.", "signature": ""},
    {"type": "text", "text": "Hello world"},
    {"type": "tool_use", "id": "toolu_x_0", "name": "f", "input": {"a": 1}},
    {"type": "tool_use", "id": "toolu_x_1", "name": "g", "input": {}}])");
  EXPECT_EQ(blocks.content(), want);
  EXPECT_TRUE(blocks.tool_use());
  // What a client does with the events (the anthropic SDK's accumulator).
  Json built = Json::array();
  std::vector<std::string> partial;
  int open = -1;
  for (const auto& [name, data] : events) {
    EXPECT_EQ(data["type"], name);
    if (name == "content_block_start") {
      EXPECT_EQ(open, -1) << "a block started inside another";
      open = data["index"];
      EXPECT_EQ(open, static_cast<int>(built.size()));
      built.push_back(data["content_block"]);
      partial.emplace_back();
    } else if (name == "content_block_delta") {
      ASSERT_EQ(data["index"], open);
      const Json& d = data["delta"];
      Json& b = built[open];
      if (d["type"] == "text_delta") {
        b["text"] = b["text"].get<std::string>() + d["text"].get<std::string>();
      } else if (d["type"] == "thinking_delta") {
        b["thinking"] =
            b["thinking"].get<std::string>() + d["thinking"].get<std::string>();
      } else {
        ASSERT_EQ(d["type"], "input_json_delta");
        partial[open] += d["partial_json"].get<std::string>();
      }
    } else {
      ASSERT_EQ(name, "content_block_stop");
      ASSERT_EQ(data["index"], open);
      if (built[open]["type"] == "tool_use") {
        built[open]["input"] = Json::parse(partial[open]);
      }
      open = -1;
    }
  }
  EXPECT_EQ(open, -1);
  EXPECT_EQ(built, want);
}

TEST(MessagesApiTest, AMessageWithNothingHasOneEmptyTextBlock) {
  MessageBlocks blocks("t_");
  const MessageBlocks::Events events = blocks.Finish();
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].first, "content_block_start");
  EXPECT_EQ(events[1].first, "content_block_stop");
  EXPECT_EQ(blocks.content(), Json::parse(R"([{"type": "text", "text": ""}])"));
  EXPECT_FALSE(blocks.tool_use());
}

TEST(MessagesApiTest, StopReasons) {
  EXPECT_EQ(MessagesStopReason("stop", "", false), "end_turn");
  EXPECT_EQ(MessagesStopReason("stop", "\n\n", false), "stop_sequence");
  EXPECT_EQ(MessagesStopReason("length", "", false), "max_tokens");
  EXPECT_EQ(MessagesStopReason("stop", "", true), "tool_use");
  EXPECT_EQ(MessagesStopReason("tool_calls", "", false), "tool_use");
  const Json e = Json::parse(
      MessagesErrorJson(absl::InvalidArgumentError("bad 'max_tokens'")));
  EXPECT_EQ(e["type"], "error");
  EXPECT_EQ(e["error"]["type"], "invalid_request_error");
  EXPECT_EQ(e["error"]["message"], "bad 'max_tokens'");
}

}  // namespace
}  // namespace shardlm
