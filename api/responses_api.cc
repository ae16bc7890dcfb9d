#include "api/responses_api.h"

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

// A message item's text: a string, or input_text / output_text parts.
absl::StatusOr<std::string> ItemText(const Ordered& content,
                                     const std::string& at) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) {
    return Invalid("'", at, ".content' must be a string or an array of parts");
  }
  std::string text;
  for (size_t k = 0; k < content.size(); ++k) {
    const Ordered& p = content[k];
    const std::string pat = absl::StrCat(at, ".content[", k, "]");
    if (!p.is_object() || !p.contains("type") || !p["type"].is_string()) {
      return Invalid("'", pat, "' must be a part with a 'type'");
    }
    const std::string type = p["type"].get<std::string>();
    if (type != "input_text" && type != "output_text" && type != "text") {
      return Invalid("'", pat, "': part type '", Echo(type),
                     "' is not supported (text only)");
    }
    if (!p.contains("text") || !p["text"].is_string()) {
      return Invalid("'", pat, ".text' must be a string");
    }
    text += p["text"].get<std::string>();
  }
  return text;
}

// The input items as chat messages appended to `out`.
absl::Status AddInput(const Ordered& input, Ordered& out) {
  if (input.is_string()) {
    out.push_back({{"role", "user"}, {"content", input.get<std::string>()}});
    return absl::OkStatus();
  }
  if (!input.is_array()) {
    return Invalid("'input' must be a string or an array of items");
  }
  for (size_t i = 0; i < input.size(); ++i) {
    const Ordered& item = input[i];
    const std::string at = absl::StrCat("input[", i, "]");
    if (!item.is_object()) return Invalid("'", at, "' must be an object");
    const std::string type = item.contains("type") && item["type"].is_string()
                                 ? item["type"].get<std::string>()
                                 : "message";
    if (type == "message") {
      if (!item.contains("role") || !item["role"].is_string()) {
        return Invalid("'", at, ".role' must be a string");
      }
      std::string role = item["role"].get<std::string>();
      if (role == "developer") role = "system";
      if (role != "user" && role != "assistant" && role != "system") {
        return Invalid("'", at,
                       ".role' must be user, assistant, system or "
                       "developer, not '",
                       Echo(role), "'");
      }
      if (!item.contains("content")) {
        return Invalid("'", at, ".content' is missing");
      }
      absl::StatusOr<std::string> text = ItemText(item["content"], at);
      if (!text.ok()) return text.status();
      out.push_back({{"role", role}, {"content", *text}});
    } else if (type == "function_call") {
      for (const char* f : {"call_id", "name", "arguments"}) {
        if (!item.contains(f) || !item[f].is_string()) {
          return Invalid("'", at, ".", f, "' must be a string");
        }
      }
      const Ordered call = {
          {"id", item["call_id"]},
          {"type", "function"},
          {"function",
           {{"name", item["name"]}, {"arguments", item["arguments"]}}}};
      // Calls after an assistant's text (or other calls) join its turn.
      if (!out.empty() && out.back()["role"] == "assistant") {
        out.back()["tool_calls"].push_back(call);
      } else {
        out.push_back({{"role", "assistant"},
                       {"content", ""},
                       {"tool_calls", Ordered::array({call})}});
      }
    } else if (type == "function_call_output") {
      if (!item.contains("call_id") || !item["call_id"].is_string()) {
        return Invalid("'", at, ".call_id' must be a string");
      }
      if (!item.contains("output")) {
        return Invalid("'", at, ".output' is missing");
      }
      absl::StatusOr<std::string> output = ItemText(item["output"], at);
      if (!output.ok()) return output.status();
      out.push_back({{"role", "tool"},
                     {"tool_call_id", item["call_id"]},
                     {"content", *output}});
    } else if (type == "reasoning") {
      // An earlier turn's reasoning: not rendered again.
    } else {
      return Invalid("'", at, ".type': item type '", Echo(type),
                     "' is not supported");
    }
  }
  return absl::OkStatus();
}

absl::Status AddTools(const Ordered& tools, Ordered& chat) {
  if (!tools.is_array()) return Invalid("'tools' must be an array");
  Ordered out = Ordered::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const Ordered& t = tools[i];
    const std::string at = absl::StrCat("tools[", i, "]");
    if (!t.is_object() || !t.contains("type") || t["type"] != "function") {
      return Invalid("'", at,
                     ".type': only function tools are supported (built-in "
                     "tools such as web_search are not)");
    }
    if (!t.contains("name") || !t["name"].is_string()) {
      return Invalid("'", at, ".name' must be a string");
    }
    Ordered function = {{"name", t["name"]}};
    if (t.contains("description")) function["description"] = t["description"];
    if (t.contains("parameters") && !t["parameters"].is_null()) {
      function["parameters"] = t["parameters"];
    }
    out.push_back({{"type", "function"}, {"function", std::move(function)}});
  }
  chat["tools"] = std::move(out);
  return absl::OkStatus();
}

absl::Status AddTextFormat(const Ordered& text, Ordered& chat) {
  if (!text.is_object()) return Invalid("'text' must be an object");
  for (const auto& [key, value] : text.items()) {
    if (key == "verbosity") continue;  // A hint to OpenAI's models.
    if (key != "format") {
      return Invalid("'text.", Echo(key), "' is not supported");
    }
    if (!value.is_object() || !value.contains("type") ||
        !value["type"].is_string()) {
      return Invalid("'text.format' must be an object with a 'type'");
    }
    const std::string type = value["type"].get<std::string>();
    if (type == "text") continue;
    if (type == "json_object") {
      chat["response_format"] = {{"type", "json_object"}};
    } else if (type == "json_schema") {
      Ordered schema = {{"name", value.value("name", Ordered("response"))}};
      if (!value.contains("schema")) {
        return Invalid("'text.format.schema' is required");
      }
      schema["schema"] = value["schema"];
      if (value.contains("strict")) schema["strict"] = value["strict"];
      chat["response_format"] = {{"type", "json_schema"},
                                 {"json_schema", std::move(schema)}};
    } else {
      return Invalid(
          "'text.format.type' must be text, json_object or "
          "json_schema, not '",
          Echo(type), "'");
    }
  }
  return absl::OkStatus();
}

// tool_choice as the chat API takes it: a string as it is, and
// {"type": "function", "name": N} as {"type": "function", "function":
// {"name": N}}.
absl::Status AddToolChoice(const Ordered& value, Ordered& chat) {
  if (value.is_string()) {
    chat["tool_choice"] = value;
  } else if (value.is_object() && value.value("type", "") == "function" &&
             value.contains("name") && value["name"].is_string()) {
    chat["tool_choice"] = {{"type", "function"},
                           {"function", {{"name", value["name"]}}}};
  } else {
    return Invalid(
        "'tool_choice' must be auto, none, required or "
        "{\"type\": \"function\", \"name\": ...}");
  }
  return absl::OkStatus();
}

}  // namespace

Json ResponseJson(const ResponseHead& head, const Json& output,
                  const v1::Usage* u) {
  const auto field = [&](const char* key, Json fallback) {
    return head.echo.contains(key) ? head.echo[key] : fallback;
  };
  Json r = {{"id", head.id},
            {"object", "response"},
            {"created_at", head.created},
            {"status", head.status},
            {"error", Json()},
            {"incomplete_details", head.status == "incomplete"
                                       ? Json{{"reason", "max_output_tokens"}}
                                       : Json()},
            {"model", head.model},
            {"output", output},
            {"instructions", field("instructions", Json())},
            {"max_output_tokens", field("max_output_tokens", Json())},
            {"temperature", field("temperature", 1.0)},
            {"top_p", field("top_p", 1.0)},
            {"tools", field("tools", Json::array())},
            {"tool_choice", field("tool_choice", "auto")},
            {"text", field("text", {{"format", {{"type", "text"}}}})},
            {"reasoning", field("reasoning", Json::object())},
            {"parallel_tool_calls", field("parallel_tool_calls", true)},
            {"previous_response_id", field("previous_response_id", Json())},
            {"metadata", field("metadata", Json::object())},
            {"store", head.store},
            {"truncation", "disabled"},
            {"usage", Json()}};
  if (u != nullptr) {
    r["usage"] = {
        {"input_tokens", u->prompt_tokens()},
        {"input_tokens_details", {{"cached_tokens", u->cached_tokens()}}},
        {"output_tokens", u->completion_tokens()},
        {"output_tokens_details", {{"reasoning_tokens", 0}}},
        {"total_tokens", u->prompt_tokens() + u->completion_tokens()}};
  }
  return r;
}

void ResponseStore::DropExpired(absl::Time now) {
  // Entries are in the order stored, all with the same ttl: the expired
  // ones are the oldest.
  while (!entries_.empty() && entries_.front().expires <= now) {
    bytes_ -= static_cast<int64_t>(entries_.front().messages.size());
    by_id_.erase(entries_.front().id);
    entries_.pop_front();
  }
}

void ResponseStore::Put(const std::string& id, std::string messages,
                        absl::Time now) {
  absl::MutexLock lock(&mu_);
  DropExpired(now);
  if (auto it = by_id_.find(id); it != by_id_.end()) {
    bytes_ -= static_cast<int64_t>(it->second->messages.size());
    entries_.erase(it->second);
    by_id_.erase(it);
  }
  if (static_cast<int64_t>(messages.size()) > limits_.max_bytes) return;
  bytes_ += static_cast<int64_t>(messages.size());
  entries_.push_back({id, std::move(messages), now + limits_.ttl});
  by_id_[id] = std::prev(entries_.end());
  while (static_cast<int64_t>(entries_.size()) > limits_.max_entries ||
         bytes_ > limits_.max_bytes) {
    bytes_ -= static_cast<int64_t>(entries_.front().messages.size());
    by_id_.erase(entries_.front().id);
    entries_.pop_front();
  }
}

std::optional<std::string> ResponseStore::Get(const std::string& id,
                                              absl::Time now) {
  absl::MutexLock lock(&mu_);
  DropExpired(now);
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return std::nullopt;
  return it->second->messages;
}

int64_t ResponseStore::size() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(entries_.size());
}

absl::StatusOr<ResponsesRequest> ResponsesToChatBody(absl::string_view raw,
                                                     ResponseStore& store) {
  const Ordered body = Ordered::parse(raw, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded() || !body.is_object()) {
    return Invalid("the body is not a JSON object");
  }
  if (!body.contains("input")) return Invalid("'input' is required");
  ResponsesRequest out;
  Ordered chat = Ordered::object();
  std::string instructions;
  Ordered conversation = Ordered::array();
  for (const auto& [key, value] : body.items()) {
    if (key == "model" || key == "temperature" || key == "top_p" ||
        key == "stream" || key == "grammar") {
      chat[key] = value;  // The chat path checks them.
      if (key != "stream" && key != "grammar") out.echo[key] = value;
    } else if (key == "max_output_tokens") {
      chat["max_tokens"] = value;
      out.echo[key] = value;
    } else if (key == "input") {
      // Below, after the previous response's conversation.
    } else if (key == "instructions") {
      if (!value.is_string() && !value.is_null()) {
        return Invalid("'instructions' must be a string");
      }
      if (value.is_string()) instructions = value.get<std::string>();
      out.echo[key] = value;
    } else if (key == "tools") {
      if (absl::Status s = AddTools(value, chat); !s.ok()) return s;
      out.echo[key] = value;
    } else if (key == "tool_choice") {
      if (absl::Status s = AddToolChoice(value, chat); !s.ok()) return s;
      out.echo[key] = value;
    } else if (key == "text") {
      if (absl::Status s = AddTextFormat(value, chat); !s.ok()) return s;
      out.echo[key] = value;
    } else if (key == "reasoning") {
      if (!value.is_object() && !value.is_null()) {
        return Invalid("'reasoning' must be an object");
      }
      if (value.is_object() && value.contains("effort") &&
          !value["effort"].is_null()) {
        chat["reasoning_effort"] = value["effort"];
      }
      out.echo[key] = value;
    } else if (key == "store") {
      if (!value.is_boolean()) return Invalid("'store' must be a boolean");
      out.store = value.get<bool>();
    } else if (key == "previous_response_id") {
      if (value.is_null()) continue;
      if (!value.is_string()) {
        return Invalid("'previous_response_id' must be a string");
      }
      const std::string id = value.get<std::string>();
      std::optional<std::string> previous = store.Get(id);
      if (!previous.has_value()) {
        return absl::NotFoundError(absl::StrCat(
            "response '", Echo(id),
            "' is not stored here (created without \"store\": true, "
            "expired or evicted)"));
      }
      conversation = Ordered::parse(*previous);
      out.echo[key] = value;
    } else if (key == "metadata" || key == "parallel_tool_calls" ||
               key == "user" || key == "service_tier") {
      out.echo[key] = value;  // No effect here (docs/api.md).
    } else if (key == "truncation") {
      if (value != "disabled") {
        return Invalid(
            "'truncation' must be \"disabled\" (a prompt longer "
            "than the context is an error)");
      }
    } else {
      return Invalid("'", Echo(key), "' is not supported by /v1/responses");
    }
  }
  if (absl::Status s = AddInput(body["input"], conversation); !s.ok()) {
    return s;
  }
  if (conversation.empty()) return Invalid("'input' has no messages");
  Ordered messages = Ordered::array();
  if (!instructions.empty()) {
    messages.push_back({{"role", "system"}, {"content", instructions}});
  }
  for (const Ordered& m : conversation) messages.push_back(m);
  chat["messages"] = std::move(messages);
  out.chat_body = chat.dump();
  out.conversation = std::move(conversation);
  return out;
}

void ResponseItems::Close(Events& events) {
  if (open_.empty()) return;
  const int index = static_cast<int>(output_.size()) - 1;
  Json& item = output_.back();
  const std::string id = item["id"].get<std::string>();
  if (open_ == "message" || open_ == "reasoning") {
    const bool message = open_ == "message";
    const Json& part = item["content"][0];
    const std::string text = part["text"].get<std::string>();
    Json done = {{"type", message ? "response.output_text.done"
                                  : "response.reasoning_text.done"},
                 {"item_id", id},
                 {"output_index", index},
                 {"content_index", 0},
                 {"text", text}};
    if (message) done["logprobs"] = Json::array();
    events.push_back(std::move(done));
    events.push_back({{"type", "response.content_part.done"},
                      {"item_id", id},
                      {"output_index", index},
                      {"content_index", 0},
                      {"part", part}});
  } else {
    events.push_back({{"type", "response.function_call_arguments.done"},
                      {"item_id", id},
                      {"output_index", index},
                      {"name", item["name"]},
                      {"arguments", item["arguments"]}});
  }
  if (item.contains("status")) item["status"] = "completed";
  events.push_back({{"type", "response.output_item.done"},
                    {"output_index", index},
                    {"item", item}});
  open_.clear();
}

Json& ResponseItems::Open(Json item, Events& events) {
  Close(events);
  const int index = static_cast<int>(output_.size());
  const std::string type = item["type"].get<std::string>();
  Json added = item;
  if (added.contains("status")) added["status"] = "in_progress";
  if (type == "message" || type == "reasoning")
    added["content"] = Json::array();
  events.push_back({{"type", "response.output_item.added"},
                    {"output_index", index},
                    {"item", added}});
  if (type == "message" || type == "reasoning") {
    events.push_back({{"type", "response.content_part.added"},
                      {"item_id", item["id"]},
                      {"output_index", index},
                      {"content_index", 0},
                      {"part", item["content"][0]}});
  }
  output_.push_back(std::move(item));
  open_ = type;
  return output_.back();
}

ResponseItems::Events ResponseItems::Push(const ToolCallEvents& pieces) {
  Events events;
  const auto text = [&](const char* type, const std::string& delta) {
    if (delta.empty()) return;
    const bool message = std::string(type) == "message";
    if (open_ != type) {
      const std::string n = absl::StrCat(suffix_, "_", items_++);
      Json part = {{"type", message ? "output_text" : "reasoning_text"},
                   {"text", ""}};
      if (message) part["annotations"] = Json::array();
      Json item = message ? Json{{"type", "message"},
                                 {"id", "msg_" + n},
                                 {"status", "completed"},
                                 {"role", "assistant"},
                                 {"content", Json::array({part})}}
                          : Json{{"type", "reasoning"},
                                 {"id", "rs_" + n},
                                 {"summary", Json::array()},
                                 {"content", Json::array({part})}};
      Open(std::move(item), events);
    }
    Json& part = output_.back()["content"][0];
    part["text"] = part["text"].get<std::string>() + delta;
    Json event = {{"type", message ? "response.output_text.delta"
                                   : "response.reasoning_text.delta"},
                  {"item_id", output_.back()["id"]},
                  {"output_index", static_cast<int>(output_.size()) - 1},
                  {"content_index", 0},
                  {"delta", delta}};
    if (message) event["logprobs"] = Json::array();
    events.push_back(std::move(event));
  };
  text("reasoning", pieces.reasoning);
  text("message", pieces.content);
  for (const ChatToolCall& call : pieces.calls) {
    const std::string n = absl::StrCat(suffix_, "_", items_++);
    Json& item = Open({{"type", "function_call"},
                       {"id", "fc_" + n},
                       {"call_id", "call_" + n},
                       {"name", call.name},
                       {"arguments", ""},
                       {"status", "completed"}},
                      events);
    item["arguments"] = call.arguments;
    events.push_back({{"type", "response.function_call_arguments.delta"},
                      {"item_id", item["id"]},
                      {"output_index", static_cast<int>(output_.size()) - 1},
                      {"delta", call.arguments}});
    Close(events);
  }
  return events;
}

ResponseItems::Events ResponseItems::Finish() {
  Events events;
  Close(events);
  return events;
}

Ordered ResponseItems::ChatMessage() const {
  std::string text;
  Ordered calls = Ordered::array();
  for (const Json& item : output_) {
    if (item["type"] == "message") {
      text += item["content"][0]["text"].get<std::string>();
    } else if (item["type"] == "function_call") {
      calls.push_back(
          {{"id", item["call_id"]},
           {"type", "function"},
           {"function",
            {{"name", item["name"]}, {"arguments", item["arguments"]}}}});
    }
  }
  Ordered message = {{"role", "assistant"}, {"content", text}};
  if (!calls.empty()) message["tool_calls"] = std::move(calls);
  return message;
}

void OpenAiApi::Responses(const HttpRequest& req, HttpResponse& res) {
  const auto fail = [&](const absl::Status& s) {
    SendError(res, s, openai_wire::ErrorJson(s));
  };
  // The body's DOM and the chat body's (a previous response's
  // conversation is bounded by the store).
  absl::StatusOr<MemoryShare> share = ChargeBody(req, 2);
  if (!share.ok()) return fail(share.status());
  absl::StatusOr<ResponsesRequest> translated =
      ResponsesToChatBody(req.body, *responses_);
  if (!translated.ok()) return fail(translated.status());
  bool stream = false;
  absl::StatusOr<v1::GenerateRequest> proto =
      TranslatedChat(translated->chat_body, &stream);
  if (!proto.ok()) return fail(proto.status());

  const std::string suffix =
      absl::StrCat(absl::ToUnixMicros(absl::Now()), "_", next_id_++);
  const std::string id = "resp_" + suffix;
  const int64_t created = absl::ToUnixSeconds(absl::Now());
  ResponseItems items(suffix);
  const OutputParsing parsing = ParsingFor(*proto);
  ToolCallStream parser(parsing.names, parsing.format, parsing.reasoning);
  std::string finish_reason;
  v1::Usage usage;
  bool started = false;
  int64_t sequence = 0;
  const auto response = [&](const std::string& status, const Json& output,
                            const v1::Usage* u) {
    return ResponseJson({.id = id,
                         .created = created,
                         .model = options_.model_name,
                         .status = status,
                         .store = translated->store,
                         .echo = translated->echo},
                        output, u);
  };
  const auto send = [&](const ResponseItems::Events& events) {
    for (Json event : events) {
      event["sequence_number"] = sequence++;
      if (!res.Write(absl::StrCat("event: ", event["type"].get<std::string>(),
                                  "\ndata: ", openai_wire::Dump(event),
                                  "\n\n"))) {
        return false;
      }
    }
    return true;
  };
  const auto begin = [&] {
    if (std::exchange(started, true)) return true;
    const Json initial = response("in_progress", Json::array(), nullptr);
    return res.Start(200, "text/event-stream") &&
           send({{{"type", "response.created"}, {"response", initial}},
                 {{"type", "response.in_progress"}, {"response", initial}}});
  };
  const auto write = [&](const v1::GenerateResponse& r) {
    if (r.has_usage()) usage = r.usage();
    if (!r.finish_reason().empty()) finish_reason = r.finish_reason();
    const ResponseItems::Events events =
        items.Push(openai_wire::ParsePiece(parser, r));
    return !stream || (begin() && send(events));
  };
  const absl::Status status = run_(
      *proto, absl::InfiniteFuture(), [&] { return res.ClientGone(); }, write,
      RequestApi::kHttp);
  if (!status.ok()) {
    if (!started) return fail(status);
    http_server_error_++;
    Json error = Json::parse(openai_wire::ErrorJson(status))["error"];
    error["type"] = "error";
    send({error});
    return;
  }
  const ResponseItems::Events last = items.Finish();
  const std::string final_status =
      finish_reason == "length" ? "incomplete" : "completed";
  const Json whole = response(final_status, items.output(), &usage);
  if (translated->store) {
    nlohmann::ordered_json conversation = translated->conversation;
    conversation.push_back(items.ChatMessage());
    responses_->Put(id, conversation.dump());
  }
  http_ok_++;
  if (!stream) {
    res.Send(200, "application/json", openai_wire::Dump(whole));
    return;
  }
  if (!begin() || !send(last)) return;
  send({{{"type", final_status == "completed" ? "response.completed"
                                              : "response.incomplete"},
         {"response", whole}}});
}

}  // namespace shardlm
