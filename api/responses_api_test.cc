#include "api/responses_api.h"

#include <string>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace shardlm {
namespace {

using Json = nlohmann::json;
using Ordered = nlohmann::ordered_json;

TEST(ResponseStoreTest, EntriesExpireAndTheOldestGoFirst) {
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  ResponseStore store(
      {.max_entries = 2, .max_bytes = 10, .ttl = absl::Seconds(60)});
  store.Put("a", "aaa", t0);
  store.Put("b", "bbb", t0 + absl::Seconds(1));
  EXPECT_EQ(store.Get("a", t0 + absl::Seconds(2)), "aaa");
  store.Put("c", "ccc", t0 + absl::Seconds(2));  // Three: a goes.
  EXPECT_EQ(store.Get("a", t0 + absl::Seconds(3)), std::nullopt);
  EXPECT_EQ(store.Get("b", t0 + absl::Seconds(3)), "bbb");
  store.Put("d", "dddddddd", t0 + absl::Seconds(3));  // 11 bytes: b, c go.
  EXPECT_EQ(store.Get("b", t0 + absl::Seconds(4)), std::nullopt);
  EXPECT_EQ(store.Get("c", t0 + absl::Seconds(4)), std::nullopt);
  EXPECT_EQ(store.Get("d", t0 + absl::Seconds(4)), "dddddddd");
  EXPECT_EQ(store.Get("d", t0 + absl::Seconds(63)), std::nullopt);  // TTL.
  EXPECT_EQ(store.size(), 0);
  store.Put("big", std::string(11, 'x'), t0);  // Over max_bytes alone.
  EXPECT_EQ(store.Get("big", t0), std::nullopt);
}

TEST(ResponsesApiTest, InputItemsAndAPreviousResponseBecomeTheChat) {
  ResponseStore store;
  store.Put("resp_1",
            R"([{"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": "", "tool_calls": [
                  {"id": "call_1", "type": "function", "function": {
                    "name": "w", "arguments": "{}"}}]}])");
  absl::StatusOr<ResponsesRequest> r = ResponsesToChatBody(
      R"({"model": "m", "instructions": "Be brief.", "max_output_tokens": 9,
          "previous_response_id": "resp_1", "store": true,
          "text": {"format": {"type": "json_schema", "name": "p",
                              "schema": {"type": "object"}}},
          "tools": [{"type": "function", "name": "w", "parameters": {}}],
          "tool_choice": {"type": "function", "name": "w"},
          "input": [
            {"type": "function_call_output", "call_id": "call_1",
             "output": "sunny"},
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {"role": "developer", "content": [{"type": "input_text",
                                               "text": "Then?"}]},
            {"type": "message", "role": "assistant",
             "content": [{"type": "output_text", "text": "Hm."}]},
            {"type": "function_call", "call_id": "call_2", "name": "w",
             "arguments": "{\"a\":1}"}]})",
      store);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->store);
  const Ordered chat = Ordered::parse(r->chat_body);
  const Ordered want = Ordered::parse(R"({
    "model": "m", "max_tokens": 9,
    "response_format": {"type": "json_schema", "json_schema": {
        "name": "p", "schema": {"type": "object"}}},
    "tools": [{"type": "function", "function": {"name": "w",
                                                "parameters": {}}}],
    "tool_choice": {"type": "function", "function": {"name": "w"}},
    "messages": [
      {"role": "system", "content": "Be brief."},
      {"role": "user", "content": "Weather?"},
      {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {
          "name": "w", "arguments": "{}"}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
      {"role": "system", "content": "Then?"},
      {"role": "assistant", "content": "Hm.", "tool_calls": [
        {"id": "call_2", "type": "function", "function": {
          "name": "w", "arguments": "{\"a\":1}"}}]}]})");
  EXPECT_EQ(chat, want) << chat.dump(2);
  // The conversation to store again: no instructions.
  EXPECT_EQ(r->conversation.size(), 5u);
  EXPECT_EQ(r->echo["previous_response_id"], "resp_1");
  EXPECT_EQ(r->echo["max_output_tokens"], 9);
}

TEST(ResponsesApiTest, RefusedByName) {
  ResponseStore store;
  const auto refused = [&](const std::string& body, absl::StatusCode code,
                           const std::string& what) {
    absl::StatusOr<ResponsesRequest> r = ResponsesToChatBody(body, store);
    ASSERT_FALSE(r.ok()) << body;
    EXPECT_EQ(r.status().code(), code) << r.status();
    EXPECT_NE(std::string(r.status().message()).find(what), std::string::npos)
        << r.status();
  };
  const auto bad = absl::StatusCode::kInvalidArgument;
  refused(R"({"model": "m"})", bad, "'input' is required");
  refused(R"({"input": "x", "previous_response_id": "resp_9"})",
          absl::StatusCode::kNotFound, "not stored here");
  refused(R"({"input": "x", "tools": [{"type": "file_search"}]})", bad,
          "only function tools");
  refused(R"({"input": "x", "truncation": "auto"})", bad, "'truncation'");
  refused(R"({"input": [{"type": "computer_call"}]})", bad,
          "item type 'computer_call'");
  refused(R"({"input": "x", "top_logprobs": 2})", bad,
          "'top_logprobs' is not supported");
  refused(R"({"input": "x", "text": {"format": {"type": "yaml"}}})", bad,
          "'text.format.type'");
}

// The items a generation's pieces make, and the events that build them:
// replayed as the openai client does, the same output.
TEST(ResponsesApiTest, StreamEventsAssembleIntoTheOutput) {
  ResponseItems items("s");
  ResponseItems::Events events;
  const auto push = [&](ToolCallEvents e) {
    for (Json& ev : items.Push(e)) events.push_back(std::move(ev));
  };
  push({.reasoning = "Hm"});
  push({.content = "It is", .reasoning = "m."});
  push({.content = " sunny.", .calls = {{.name = "w", .arguments = "{}"}}});
  for (Json& ev : items.Finish()) events.push_back(std::move(ev));
  const Json want = Json::parse(R"([
    {"type": "reasoning", "id": "rs_s_0", "summary": [],
     "content": [{"type": "reasoning_text", "text": "Hmm."}]},
    {"type": "message", "id": "msg_s_1", "status": "completed",
     "role": "assistant", "content": [
       {"type": "output_text", "text": "It is sunny.", "annotations": []}]},
    {"type": "function_call", "id": "fc_s_2", "call_id": "call_s_2",
     "name": "w", "arguments": "{}", "status": "completed"}])");
  EXPECT_EQ(items.output(), want) << items.output().dump(2);
  Json built = Json::array();
  for (const Json& e : events) {
    const std::string type = e["type"];
    if (type == "response.output_item.added") {
      EXPECT_EQ(e["output_index"], built.size());
      built.push_back(e["item"]);
    } else if (type == "response.content_part.added") {
      built[e["output_index"].get<int>()]["content"].push_back(e["part"]);
    } else if (type == "response.output_text.delta" ||
               type == "response.reasoning_text.delta") {
      Json& part = built[e["output_index"].get<int>()]["content"][0];
      part["text"] =
          part["text"].get<std::string>() + e["delta"].get<std::string>();
    } else if (type == "response.function_call_arguments.delta") {
      Json& item = built[e["output_index"].get<int>()];
      item["arguments"] =
          item["arguments"].get<std::string>() + e["delta"].get<std::string>();
    } else if (type == "response.output_item.done") {
      // The finished item replaces what was built, and equals it but for
      // its status.
      Json& item = built[e["output_index"].get<int>()];
      if (item.contains("status")) item["status"] = "completed";
      EXPECT_EQ(item, e["item"]);
    }
  }
  EXPECT_EQ(built, want);
  const Ordered chat = items.ChatMessage();
  EXPECT_EQ(chat["content"], "It is sunny.");
  EXPECT_EQ(chat["tool_calls"][0]["id"], "call_s_2");
}

}  // namespace
}  // namespace shardlm
