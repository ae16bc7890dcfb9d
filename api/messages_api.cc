#include "api/messages_api.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "api/openai_api.h"
#include "api/openai_protocol.h"

namespace shardlm {
namespace {

using Json = nlohmann::json;
using Ordered = nlohmann::ordered_json;

using openai_wire::Echo;
using openai_wire::Invalid;

// The text of a string or of an array of text blocks (system, a
// tool_result's content).
absl::StatusOr<std::string> TextOf(const Ordered& v, const std::string& where) {
  if (v.is_string()) return v.get<std::string>();
  if (!v.is_array()) {
    return Invalid("'", where, "' must be a string or an array of blocks");
  }
  std::string text;
  for (size_t i = 0; i < v.size(); ++i) {
    const Ordered& b = v[i];
    const std::string at = absl::StrCat(where, "[", i, "]");
    if (!b.is_object() || !b.contains("type") || !b["type"].is_string()) {
      return Invalid("'", at, "' must be a block with a 'type'");
    }
    if (b["type"] != "text") {
      return Invalid("'", at, "': content block type '",
                     Echo(b["type"].get<std::string>()),
                     "' is not supported here (text only)");
    }
    if (!b.contains("text") || !b["text"].is_string()) {
      return Invalid("'", at, ".text' must be a string");
    }
    text += b["text"].get<std::string>();
  }
  return text;
}

// One Messages message as OpenAI messages appended to `out`: an assistant's
// text and tool_use blocks as one message with tool_calls; a user's
// tool_result blocks as tool messages, then its text as a user message.
absl::Status AddMessage(const Ordered& m, size_t i, Ordered& out) {
  const std::string at = absl::StrCat("messages[", i, "]");
  if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) {
    return Invalid("'", at, "' must be an object with a 'role'");
  }
  const std::string role = m["role"].get<std::string>();
  if (role != "user" && role != "assistant") {
    return Invalid("'", at, ".role' must be 'user' or 'assistant', not '",
                   Echo(role), "'");
  }
  if (!m.contains("content")) return Invalid("'", at, ".content' is missing");
  const Ordered& content = m["content"];
  if (content.is_string()) {
    out.push_back({{"role", role}, {"content", content.get<std::string>()}});
    return absl::OkStatus();
  }
  if (!content.is_array()) {
    return Invalid("'", at, ".content' must be a string or an array of blocks");
  }
  std::string text;
  Ordered calls = Ordered::array();
  Ordered results = Ordered::array();
  for (size_t k = 0; k < content.size(); ++k) {
    const Ordered& b = content[k];
    const std::string bat = absl::StrCat(at, ".content[", k, "]");
    if (!b.is_object() || !b.contains("type") || !b["type"].is_string()) {
      return Invalid("'", bat, "' must be a block with a 'type'");
    }
    const std::string type = b["type"].get<std::string>();
    if (type == "text") {
      if (!b.contains("text") || !b["text"].is_string()) {
        return Invalid("'", bat, ".text' must be a string");
      }
      text += b["text"].get<std::string>();
    } else if (type == "tool_use" && role == "assistant") {
      if (!b.contains("id") || !b["id"].is_string() || !b.contains("name") ||
          !b["name"].is_string() || !b.contains("input") ||
          !b["input"].is_object()) {
        return Invalid("'", bat,
                       "' must have a string 'id' and 'name' and an object "
                       "'input'");
      }
      calls.push_back(
          {{"id", b["id"]},
           {"type", "function"},
           {"function",
            {{"name", b["name"]}, {"arguments", b["input"].dump()}}}});
    } else if (type == "tool_result" && role == "user") {
      if (!b.contains("tool_use_id") || !b["tool_use_id"].is_string()) {
        return Invalid("'", bat, ".tool_use_id' must be a string");
      }
      std::string result;
      if (b.contains("content")) {
        absl::StatusOr<std::string> t =
            TextOf(b["content"], absl::StrCat(bat, ".content"));
        if (!t.ok()) return t.status();
        result = *std::move(t);
      }
      results.push_back({{"role", "tool"},
                         {"tool_call_id", b["tool_use_id"]},
                         {"content", result}});
    } else if ((type == "thinking" || type == "redacted_thinking") &&
               role == "assistant") {
      // An earlier turn's reasoning: not sent back to the template (as
      // Anthropic's models drop it from earlier turns).
    } else {
      return Invalid("'", bat, "': content block type '", Echo(type),
                     "' is not supported in a ", role, " message");
    }
  }
  for (Ordered& r : results) out.push_back(std::move(r));
  if (role == "assistant") {
    Ordered msg = {{"role", "assistant"}, {"content", text}};
    if (!calls.empty()) msg["tool_calls"] = std::move(calls);
    out.push_back(std::move(msg));
  } else if (!text.empty() || results.empty()) {
    out.push_back({{"role", "user"}, {"content", text}});
  }
  return absl::OkStatus();
}

absl::Status AddTools(const Ordered& tools, Ordered& chat) {
  if (!tools.is_array()) return Invalid("'tools' must be an array");
  Ordered out = Ordered::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const Ordered& t = tools[i];
    const std::string at = absl::StrCat("tools[", i, "]");
    if (!t.is_object()) return Invalid("'", at, "' must be an object");
    if (t.contains("type") && t["type"] != "custom") {
      return Invalid("'", at, ".type': server tools ('",
                     Echo(t["type"].is_string() ? t["type"].get<std::string>()
                                                : t["type"].dump()),
                     "') are not supported; give client tools with an "
                     "'input_schema'");
    }
    if (!t.contains("name") || !t["name"].is_string()) {
      return Invalid("'", at, ".name' must be a string");
    }
    if (!t.contains("input_schema") || !t["input_schema"].is_object()) {
      return Invalid("'", at, ".input_schema' must be an object");
    }
    Ordered function = {{"name", t["name"]}};
    if (t.contains("description")) function["description"] = t["description"];
    function["parameters"] = t["input_schema"];
    out.push_back({{"type", "function"}, {"function", std::move(function)}});
  }
  chat["tools"] = std::move(out);
  return absl::OkStatus();
}

absl::Status AddToolChoice(const Ordered& choice, Ordered& chat) {
  if (!choice.is_object() || !choice.contains("type") ||
      !choice["type"].is_string()) {
    return Invalid("'tool_choice' must be an object with a 'type'");
  }
  const std::string type = choice["type"].get<std::string>();
  if (type == "auto" || type == "none") {
    chat["tool_choice"] = type;
  } else if (type == "any") {
    chat["tool_choice"] = "required";
  } else if (type == "tool") {
    if (!choice.contains("name") || !choice["name"].is_string()) {
      return Invalid("'tool_choice.name' must be a string");
    }
    chat["tool_choice"] = {{"type", "function"},
                           {"function", {{"name", choice["name"]}}}};
  } else {
    return Invalid("'tool_choice.type' must be auto, any, tool or none, not '",
                   Echo(type), "'");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> MessagesToChatBody(absl::string_view raw) {
  const Ordered body = Ordered::parse(raw, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded() || !body.is_object()) {
    return Invalid("the body is not a JSON object");
  }
  Ordered chat = Ordered::object();
  if (!body.contains("max_tokens")) return Invalid("'max_tokens' is required");
  if (!body.contains("messages")) return Invalid("'messages' is required");
  Ordered messages = Ordered::array();
  for (const auto& [key, value] : body.items()) {
    if (key == "model" || key == "max_tokens" || key == "temperature" ||
        key == "top_p" || key == "top_k" || key == "stream" ||
        key == "grammar") {
      chat[key] = value;  // The chat path checks their types and ranges.
    } else if (key == "stop_sequences") {
      chat["stop"] = value;
    } else if (key == "system") {
      absl::StatusOr<std::string> text = TextOf(value, "system");
      if (!text.ok()) return text.status();
      if (!text->empty()) {
        messages.insert(messages.begin(),
                        Ordered{{"role", "system"}, {"content", *text}});
      }
    } else if (key == "messages") {
      if (!value.is_array() || value.empty()) {
        return Invalid("'messages' must be a non-empty array");
      }
      for (size_t i = 0; i < value.size(); ++i) {
        if (absl::Status s = AddMessage(value[i], i, messages); !s.ok()) {
          return s;
        }
      }
    } else if (key == "tools") {
      if (absl::Status s = AddTools(value, chat); !s.ok()) return s;
    } else if (key == "tool_choice") {
      if (absl::Status s = AddToolChoice(value, chat); !s.ok()) return s;
    } else if (key == "thinking") {
      if (!value.is_object() || !value.contains("type") ||
          (value["type"] != "enabled" && value["type"] != "disabled")) {
        return Invalid("'thinking.type' must be 'enabled' or 'disabled'");
      }
      // The template's switch (Qwen3's enable_thinking); budget_tokens is
      // not enforced (docs/api.md).
      chat["chat_template_kwargs"] = {
          {"enable_thinking", value["type"] == "enabled"}};
    } else if (key == "metadata" || key == "service_tier" ||
               key == "cache_control") {
      // Accounting and caching hints with no effect here: the prefix
      // cache needs none (docs/api.md).
    } else {
      return Invalid("'", Echo(key), "' is not supported by /v1/messages");
    }
  }
  chat["messages"] = std::move(messages);
  return chat.dump();
}

std::string MessagesErrorJson(const absl::Status& status) {
  const char* type = "api_error";
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kFailedPrecondition:
      type = "invalid_request_error";
      break;
    case absl::StatusCode::kUnauthenticated:
      type = "authentication_error";
      break;
    case absl::StatusCode::kNotFound:
      type = "not_found_error";
      break;
    case absl::StatusCode::kResourceExhausted:
      type = "rate_limit_error";
      break;
    case absl::StatusCode::kUnavailable:
      type = "overloaded_error";
      break;
    default:
      break;
  }
  return Json{{"type", "error"},
              {"error", {{"type", type}, {"message", status.message()}}}}
      .dump(-1, ' ', false, Json::error_handler_t::replace);
}

std::string MessagesStopReason(const std::string& finish_reason,
                               const std::string& stop_sequence,
                               bool tool_use) {
  if (tool_use || finish_reason == "tool_calls") return "tool_use";
  if (finish_reason == "length") return "max_tokens";
  if (!stop_sequence.empty()) return "stop_sequence";
  return "end_turn";
}

void MessageBlocks::Close(Events& events) {
  if (open_.empty()) return;
  events.emplace_back("content_block_stop",
                      Json{{"type", "content_block_stop"},
                           {"index", static_cast<int>(content_.size()) - 1}});
  open_.clear();
}

void MessageBlocks::Open(const Json& block, Events& events) {
  Close(events);
  content_.push_back(block);
  open_ = block["type"].get<std::string>();
  events.emplace_back("content_block_start",
                      Json{{"type", "content_block_start"},
                           {"index", static_cast<int>(content_.size()) - 1},
                           {"content_block", block}});
}

MessageBlocks::Events MessageBlocks::Push(const ToolCallEvents& pieces) {
  Events events;
  const auto delta = [&](const char* block, const char* field,
                         const char* delta_type, const std::string& text) {
    if (text.empty()) return;
    if (open_ != block) {
      Json start = {{"type", block}, {field, ""}};
      // A thinking block's signature (Anthropic's, to verify it when sent
      // back): none here.
      if (std::string(block) == "thinking") start["signature"] = "";
      Open(start, events);
    }
    Json& b = content_.back();
    b[field] = b[field].get<std::string>() + text;
    events.emplace_back("content_block_delta",
                        Json{{"type", "content_block_delta"},
                             {"index", static_cast<int>(content_.size()) - 1},
                             {"delta", {{"type", delta_type}, {field, text}}}});
  };
  delta("thinking", "thinking", "thinking_delta", pieces.reasoning);
  delta("text", "text", "text_delta", pieces.content);
  for (const ChatToolCall& call : pieces.calls) {
    const std::string id = absl::StrCat(id_prefix_, calls_++);
    Open({{"type", "tool_use"},
          {"id", id},
          {"name", call.name},
          {"input", Json::object()}},
         events);
    // The parser gives the arguments as a JSON object's text.
    content_.back()["input"] = Json::parse(call.arguments, nullptr, false);
    if (content_.back()["input"].is_discarded()) {
      content_.back()["input"] = Json::object();
    }
    events.emplace_back("content_block_delta",
                        Json{{"type", "content_block_delta"},
                             {"index", static_cast<int>(content_.size()) - 1},
                             {"delta",
                              {{"type", "input_json_delta"},
                               {"partial_json", call.arguments}}}});
    Close(events);
  }
  return events;
}

MessageBlocks::Events MessageBlocks::Finish() {
  Events events;
  if (content_.empty()) Open({{"type", "text"}, {"text", ""}}, events);
  Close(events);
  return events;
}

void OpenAiApi::Messages(const HttpRequest& req, HttpResponse& res) {
  const auto fail = [&](const absl::Status& s) {
    SendError(res, s, MessagesErrorJson(s));
  };
  absl::StatusOr<MemoryShare> share = ChargeBody(req, 2);
  if (!share.ok()) return fail(share.status());
  absl::StatusOr<std::string> chat_body = MessagesToChatBody(req.body);
  if (!chat_body.ok()) return fail(chat_body.status());
  bool stream = false;
  absl::StatusOr<v1::GenerateRequest> proto =
      TranslatedChat(*chat_body, &stream);
  if (!proto.ok()) return fail(proto.status());

  const std::string serial =
      absl::StrCat(absl::ToUnixMicros(absl::Now()), "_", next_id_++);
  const std::string id = "msg_" + serial;
  MessageBlocks blocks("toolu_" + serial + "_");
  // Every output goes through the parsers (an empty tool list parses no
  // calls), so that reasoning, text and calls become blocks.
  const OutputParsing parsing = ParsingFor(*proto);
  ToolCallStream parser(parsing.names, parsing.format, parsing.reasoning);
  std::string finish_reason, stop_sequence;
  v1::Usage usage;
  bool started = false;
  const auto send = [&](const MessageBlocks::Events& events) {
    for (const auto& [event, data] : events) {
      if (!res.Write(absl::StrCat(
              "event: ", event, "\ndata: ", openai_wire::Dump(data), "\n\n"))) {
        return false;
      }
    }
    return true;
  };
  const auto usage_json = [&] {
    return Json{{"input_tokens", usage.prompt_tokens()},
                {"output_tokens", usage.completion_tokens()},
                {"cache_read_input_tokens", usage.cached_tokens()}};
  };
  const auto message = [&](const Json& content, const Json& stop_reason,
                           const Json& stop_seq) {
    return Json{{"id", id},
                {"type", "message"},
                {"role", "assistant"},
                {"model", options_.model_name},
                {"content", content},
                {"stop_reason", stop_reason},
                {"stop_sequence", stop_seq},
                {"usage", usage_json()}};
  };
  const auto begin = [&] {
    if (std::exchange(started, true)) return true;
    // The prompt's size is known at the end only: message_delta has it.
    return res.Start(200, "text/event-stream") &&
           send({{"message_start",
                  {{"type", "message_start"},
                   {"message", message(Json::array(), Json(), Json())}}}});
  };
  const auto write = [&](const v1::GenerateResponse& r) {
    if (r.has_usage()) usage = r.usage();
    if (!r.finish_reason().empty()) {
      finish_reason = r.finish_reason();
      stop_sequence = r.stop_sequence();
    }
    const MessageBlocks::Events events =
        blocks.Push(openai_wire::ParsePiece(parser, r));
    return !stream || (begin() && send(events));
  };
  const absl::Status status = run_(
      *proto, absl::InfiniteFuture(), [&] { return res.ClientGone(); }, write,
      RequestApi::kHttp);
  if (!status.ok()) {
    if (!started) return fail(status);
    http_server_error_++;
    res.Write(absl::StrCat("event: error\ndata: ", MessagesErrorJson(status),
                           "\n\n"));
    return;
  }
  const MessageBlocks::Events last = blocks.Finish();
  const std::string stop_reason =
      MessagesStopReason(finish_reason, stop_sequence, blocks.tool_use());
  const Json stop_seq =
      stop_reason == "stop_sequence" ? Json(stop_sequence) : Json();
  http_ok_++;
  if (!stream) {
    res.Send(
        200, "application/json",
        openai_wire::Dump(message(blocks.content(), stop_reason, stop_seq)));
    return;
  }
  if (!begin() || !send(last)) return;
  send(
      {{"message_delta",
        {{"type", "message_delta"},
         {"delta", {{"stop_reason", stop_reason}, {"stop_sequence", stop_seq}}},
         {"usage", usage_json()}}},
       {"message_stop", {{"type", "message_stop"}}}});
}

}  // namespace shardlm
