#include "api/openai_api.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <optional>
#include <random>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "api/api_key.h"
#include "api/messages_api.h"
#include "api/openai_request_scan.h"
#include "api/request_ranges.h"
#include "api/responses_api.h"
#include "core/status.h"
#include "grammar/json_schema.h"
#include "model/tool_calls.h"
#include "nlohmann/json.hpp"
#include "step/kv_cache.h"
#include "step/step.h"

namespace shardlm {
namespace {

using Json = nlohmann::json;

// Serializes `j`; invalid UTF-8 in its strings (a client's path or model
// name echoed in an error, a token's bytes in logprobs) becomes U+FFFD
// instead of an exception.
std::string Dump(const Json& j) {
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

// A client's string as an error message echoes it: at most 256 bytes of it
// (a 1 MB model name must not come back whole).
std::string Echo(absl::string_view client_text) {
  constexpr size_t kMaxEcho = 256;
  if (client_text.size() <= kMaxEcho) return std::string(client_text);
  return absl::StrCat(client_text.substr(0, kMaxEcho), "...");
}

absl::Status Invalid(auto&&... parts) {
  return absl::InvalidArgumentError(absl::StrCat(parts...));
}

// What a parsed body costs at most per JSON value: a value is 16 bytes, an
// array slot up to twice that while the vector grows, an object member a
// map node with its key (~80 bytes); the strings' bytes are charged
// separately (at most the body's size).
constexpr int64_t kDomBytesPerValue = 96;

std::string ErrorJson(const absl::Status& status) {
  const char* type = "server_error";
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
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
    default:
      break;
  }
  return Dump(Json{{"error",
                    {{"message", std::string(status.message())},
                     {"type", type},
                     {"code", HttpStatusFor(status.code())}}}});
}

// Reads an optional field of type T; InvalidArgument naming it when the
// type is wrong.
template <typename T>
absl::Status Get(const Json& body, const char* name, T* out) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return absl::OkStatus();
  bool ok;
  if constexpr (std::is_same_v<T, bool>) {
    ok = it->is_boolean();
  } else if constexpr (std::is_integral_v<T>) {
    // Unsigned JSON numbers above INT64_MAX would wrap in get<int64_t>.
    ok = it->is_number_integer() &&
         (!it->is_number_unsigned() ||
          it->template get<uint64_t>() <=
              static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) &&
         it->template get<int64_t>() >= std::numeric_limits<T>::min() &&
         it->template get<int64_t>() <= std::numeric_limits<T>::max();
  } else if constexpr (std::is_floating_point_v<T>) {
    ok = it->is_number();
  } else {
    ok = it->is_string();
  }
  if (!ok) return Invalid("'", name, "' has the wrong type or range");
  *out = it->template get<T>();
  return absl::OkStatus();
}

// An OpenAI "messages" array as the request's conversation (the service
// renders it in the model's chat format): system, user, assistant (with
// "tool_calls") and tool messages.
absl::Status AddMessages(const Json& messages, v1::GenerateRequest& req) {
  if (!messages.is_array() || messages.empty()) {
    return Invalid("'messages' must be a non-empty array");
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    const Json& m = messages[i];
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) {
      return Invalid("messages[", i, "] needs a string 'role'");
    }
    const std::string role = m["role"];
    if (role != "system" && role != "developer" && role != "user" &&
        role != "assistant" && role != "tool") {
      return Invalid("messages[", i, "].role '", Echo(role),
                     "' is not system, developer, user, assistant or tool");
    }
    std::string content;
    const Json& c = m.contains("content") ? m["content"] : Json();
    const bool calls = role == "assistant" && m.contains("tool_calls") &&
                       !m["tool_calls"].is_null();
    if (c.is_string()) {
      content = c;
    } else if (c.is_array()) {  // [{"type": "text", "text": ...}]
      for (const Json& part : c) {
        if (!part.is_object() || !part.contains("type") ||
            part["type"] != "text" || !part.contains("text") ||
            !part["text"].is_string()) {
          return Invalid("messages[", i,
                         "].content: only text parts are supported");
        }
        content += part["text"].get<std::string>();
      }
    } else if (!(c.is_null() && calls)) {  // An assistant's calls alone.
      return Invalid("messages[", i, "].content must be a string or parts");
    }
    v1::ChatMessage* out = req.add_messages();
    out->set_role(role);
    out->set_content(std::move(content));
    if (m.contains("tool_call_id") && m["tool_call_id"].is_string()) {
      out->set_tool_call_id(m["tool_call_id"].get<std::string>());
    }
    if (!calls) continue;
    if (!m["tool_calls"].is_array()) {
      return Invalid("messages[", i, "].tool_calls must be an array");
    }
    for (size_t k = 0; k < m["tool_calls"].size(); ++k) {
      const Json& call = m["tool_calls"][k];
      const auto field = [&](const char* name) {
        return absl::StrCat("messages[", i, "].tool_calls[", k, "].", name);
      };
      if (!call.is_object() || !call.contains("function") ||
          !call["function"].is_object()) {
        return Invalid(field("function"), " must be an object");
      }
      const Json& f = call["function"];
      if (!f.contains("name") || !f["name"].is_string()) {
        return Invalid(field("function.name"), " must be a string");
      }
      v1::ToolCall* tc = out->add_tool_calls();
      tc->set_name(f["name"].get<std::string>());
      if (call.contains("id") && call["id"].is_string()) {
        tc->set_id(call["id"].get<std::string>());
      }
      // OpenAI sends the arguments as JSON text; an object is taken too.
      const Json args = f.contains("arguments") ? f["arguments"] : Json();
      if (args.is_string()) {
        tc->set_arguments(args.get<std::string>());
      } else if (args.is_object()) {
        tc->set_arguments(Dump(args));
      } else {
        return Invalid(field("function.arguments"),
                       " must be a JSON object as a string");
      }
    }
  }
  return absl::OkStatus();
}

// vLLM's chat_template_kwargs: the template variables a request may set.
// Only enable_thinking (Qwen3's) is taken; another key is refused rather
// than ignored, since its effect would be silently lost.
absl::Status AddChatTemplateKwargs(const Json& body, v1::GenerateRequest& req) {
  if (!body.contains("chat_template_kwargs") ||
      body["chat_template_kwargs"].is_null()) {
    return absl::OkStatus();
  }
  const Json& kwargs = body["chat_template_kwargs"];
  if (!kwargs.is_object()) {
    return Invalid("'chat_template_kwargs' must be an object");
  }
  for (const auto& [key, value] : kwargs.items()) {
    if (key != "enable_thinking") {
      return Invalid("chat_template_kwargs '", key.substr(0, 64),
                     "' is not supported (enable_thinking is)");
    }
    if (!value.is_boolean()) {
      return Invalid(
          "chat_template_kwargs 'enable_thinking' must be a "
          "boolean");
    }
    req.set_enable_thinking(value.get<bool>());
  }
  return absl::OkStatus();
}

// OpenAI's "tools" (function tools) and "tool_choice". `ordered` is the
// body parsed again in order (a schema's properties render, and are
// generated, in the client's order), when it has tools.
absl::Status AddTools(const Json& body, const nlohmann::ordered_json* ordered,
                      v1::GenerateRequest& req) {
  const bool has_tools = body.contains("tools") && !body["tools"].is_null();
  if (has_tools) {
    const Json& tools = body["tools"];
    if (!tools.is_array()) return Invalid("'tools' must be an array");
    for (size_t i = 0; i < tools.size(); ++i) {
      const Json& t = tools[i];
      if (!t.is_object() || t.value("type", "") != "function") {
        return Invalid("tools[", i,
                       "].type must be 'function' (the only kind of tool)");
      }
      if (!t.contains("function") || !t["function"].is_object()) {
        return Invalid("tools[", i, "].function must be an object");
      }
      const Json& f = t["function"];
      if (!f.contains("name") || !f["name"].is_string()) {
        return Invalid("tools[", i, "].function.name must be a string");
      }
      v1::Tool* tool = req.add_tools();
      tool->set_name(f["name"].get<std::string>());
      if (f.contains("description") && !f["description"].is_null()) {
        if (!f["description"].is_string()) {
          return Invalid("tools[", i,
                         "].function.description must be a string");
        }
        tool->set_description(f["description"].get<std::string>());
      }
      if (f.contains("parameters") && !f["parameters"].is_null()) {
        if (!f["parameters"].is_object()) {
          return Invalid("tools[", i,
                         "].function.parameters must be a JSON Schema object");
        }
        if (const size_t n = f["parameters"].dump().size();
            n > kMaxJsonSchemaBytes) {
          return Invalid("tools[", i, "].function.parameters is ", n,
                         " bytes; at most ", kMaxJsonSchemaBytes,
                         " are accepted");
        }
        tool->set_parameters(
            (*ordered)["tools"][i]["function"]["parameters"].dump());
      }
    }
  }
  const Json& choice =
      body.contains("tool_choice") ? body["tool_choice"] : Json();
  if (choice.is_string()) {
    req.set_tool_choice(choice.get<std::string>());  // The service checks it.
  } else if (choice.is_object()) {
    if (choice.value("type", "") != "function" ||
        !choice.contains("function") || !choice["function"].is_object() ||
        !choice["function"].contains("name") ||
        !choice["function"]["name"].is_string()) {
      return Invalid(
          "'tool_choice' must be auto, none, required or {\"type\": "
          "\"function\", \"function\": {\"name\": ...}}");
    }
    req.set_tool_choice_function(choice["function"]["name"].get<std::string>());
  } else if (!choice.is_null()) {
    return Invalid("'tool_choice' must be a string or an object");
  }
  return absl::OkStatus();
}

// OpenAI's "logit_bias": an object of token ids (as strings) to numbers.
// Its size is bounded before the parse (OpenAiScanLimits::max_logit_bias);
// the ranges are the service's.
absl::Status AddLogitBias(const Json& body, v1::SamplingParams& s) {
  auto it = body.find("logit_bias");
  if (it == body.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_object()) {
    return Invalid("'logit_bias' must be an object of token ids to biases");
  }
  for (const auto& [key, value] : it->items()) {
    int64_t id = 0;
    const bool digits = !key.empty() && key.size() <= 10 &&
                        std::all_of(key.begin(), key.end(), [](char c) {
                          return c >= '0' && c <= '9';
                        });
    if (digits) id = std::stoll(key);
    if (!digits || id > std::numeric_limits<int32_t>::max()) {
      return Invalid(
          "'logit_bias' keys must be token ids (integers >= 0), "
          "got '",
          Echo(key), "'");
    }
    if (!value.is_number()) {
      return Invalid("'logit_bias' values must be numbers (token ", id, ")");
    }
    if (s.logit_bias().count(static_cast<int32_t>(id)) > 0) {
      return Invalid("'logit_bias' gives token ", id, " twice");
    }
    (*s.mutable_logit_bias())[static_cast<int32_t>(id)] =
        static_cast<float>(value.get<double>());
  }
  return absl::OkStatus();
}

// Structured outputs: OpenAI's "response_format" (text, json_object,
// json_schema) or our "grammar" extension, as the request's constraint.
// The schema's text is taken from `raw_body` parsed again in order, since
// the DOM sorts keys and properties are generated in the schema's order.
absl::Status AddConstraint(const Json& body, absl::string_view raw_body,
                           v1::GenerateRequest& req) {
  const bool has_format =
      body.contains("response_format") && !body["response_format"].is_null();
  const bool has_grammar =
      body.contains("grammar") && !body["grammar"].is_null();
  if (has_format && has_grammar) {
    return Invalid("give one of 'response_format' and 'grammar'");
  }
  if (has_grammar) {
    if (!body["grammar"].is_string()) {
      return Invalid("'grammar' must be a string (GBNF-like grammar text)");
    }
    req.mutable_constraint()->set_grammar(body["grammar"].get<std::string>());
    return absl::OkStatus();
  }
  if (!has_format) return absl::OkStatus();
  const Json& format = body["response_format"];
  if (!format.is_object() || !format.contains("type") ||
      !format["type"].is_string()) {
    return Invalid("'response_format' must be an object with a string 'type'");
  }
  const std::string type = format["type"].get<std::string>();
  if (type == "text") return absl::OkStatus();
  if (type == "json_object") {
    req.mutable_constraint()->set_json_object(true);
    return absl::OkStatus();
  }
  if (type != "json_schema") {
    return Invalid("'response_format' type '", Echo(type),
                   "' is not supported (text, json_object and json_schema "
                   "are)");
  }
  const auto it = format.find("json_schema");
  if (it == format.end() || !it->is_object()) {
    return Invalid("'response_format.json_schema' must be an object");
  }
  const Json& js = *it;
  if (js.contains("name") && !js["name"].is_string()) {
    return Invalid("'response_format.json_schema.name' must be a string");
  }
  if (js.contains("strict") && !js["strict"].is_null() &&
      !js["strict"].is_boolean()) {
    return Invalid("'response_format.json_schema.strict' must be a boolean");
  }
  if (!js.contains("schema") ||
      !(js["schema"].is_object() || js["schema"].is_boolean())) {
    return Invalid(
        "'response_format.json_schema.schema' must be a JSON Schema object");
  }
  // Its size first, so that a huge schema is refused before a second parse.
  if (const size_t n = js["schema"].dump().size(); n > kMaxJsonSchemaBytes) {
    return Invalid("json_schema: the schema is ", n, " bytes; at most ",
                   kMaxJsonSchemaBytes, " are accepted");
  }
  // Ordered: the scan and the first parse accepted this body already.
  const nlohmann::ordered_json ordered = nlohmann::ordered_json::parse(
      raw_body, nullptr, /*allow_exceptions=*/false);
  if (ordered.is_discarded()) return Invalid("the body is not a JSON object");
  req.mutable_constraint()->set_json_schema(
      ordered["response_format"]["json_schema"]["schema"].dump());
  return absl::OkStatus();
}

// What the HTTP response shows beside the service's text, as the request
// body asked.
struct ResponseShape {
  int top_n = -1;         // Alternatives reported per token (-1: no logprobs).
  bool echo = false;      // The prompt leads each choice (completions).
  std::string echo_text;  // What echo prepends to each choice's text.
  // vLLM's prompt_logprobs: alternatives per prompt token (-1: not asked).
  int prompt_top_n = -1;
};

// The OpenAI request as a shardlm.v1 request, and what its response shows.
absl::StatusOr<v1::GenerateRequest> ToProto(const Json& body,
                                            absl::string_view raw_body,
                                            bool chat,
                                            const std::string& model_name,
                                            int64_t context_length,
                                            ResponseShape* shape) {
  int* const top_n = &shape->top_n;
  v1::GenerateRequest req;
  std::string model;
  RETURN_IF_ERROR(Get(body, "model", &model));
  if (!model.empty() && model != model_name) {
    return absl::NotFoundError(absl::StrCat("model '", Echo(model),
                                            "' is not served here (this "
                                            "server serves '",
                                            model_name, "')"));
  }
  int64_t n = 1, best_of = 1;
  bool& echo = shape->echo;
  RETURN_IF_ERROR(Get(body, "n", &n));
  RETURN_IF_ERROR(Get(body, "best_of", &best_of));
  RETURN_IF_ERROR(Get(body, "echo", &echo));
  if (n < 1 || n > 16) return Invalid("n must be 1 to 16, got ", n);
  if (best_of != 1 && best_of != n) {
    return Invalid("'best_of' other than n is not supported");
  }
  req.set_n(static_cast<int32_t>(n));
  if (echo && chat) return Invalid("'echo' is for /v1/completions");
  if (body.contains("suffix") && !body["suffix"].is_null()) {
    return Invalid("'suffix' is not supported");
  }

  if (chat) {
    if (!body.contains("messages")) return Invalid("'messages' is required");
    RETURN_IF_ERROR(AddMessages(body["messages"], req));
    std::optional<nlohmann::ordered_json> ordered;
    if (body.contains("tools") && !body["tools"].is_null()) {
      ordered = nlohmann::ordered_json::parse(raw_body, nullptr,
                                              /*allow_exceptions=*/false);
      if (ordered->is_discarded()) {
        return Invalid("the body is not a JSON object");
      }
    }
    RETURN_IF_ERROR(AddTools(body, ordered ? &*ordered : nullptr, req));
    // OpenAI's reasoning models' knob; the template decides what it means.
    if (body.contains("reasoning_effort") &&
        !body["reasoning_effort"].is_null()) {
      if (!body["reasoning_effort"].is_string()) {
        return Invalid("'reasoning_effort' must be a string");
      }
      req.set_reasoning_effort(body["reasoning_effort"].get<std::string>());
    }
    RETURN_IF_ERROR(AddChatTemplateKwargs(body, req));
  } else {
    for (const char* field :
         {"tools", "tool_choice", "reasoning_effort", "chat_template_kwargs"}) {
      if (body.contains(field) && !body[field].is_null()) {
        return Invalid("'", field, "' is for /v1/chat/completions");
      }
    }
    const Json& p = body.contains("prompt") ? body["prompt"] : Json();
    if (p.is_string()) {
      req.set_prompt(p.get<std::string>());
    } else if (p.is_array() && p.size() == 1 && p[0].is_string()) {
      req.set_prompt(p[0].get<std::string>());
    } else if (p.is_array() && !p.empty() && p[0].is_number_integer()) {
      for (const Json& t : p) {
        if (!t.is_number_integer() ||
            (t.is_number_unsigned() &&
             t.get<uint64_t>() > std::numeric_limits<int32_t>::max()) ||
            t.get<int64_t>() < 0 ||
            t.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
          return Invalid("'prompt' token ids must be non-negative integers");
        }
        req.add_prompt_token_ids(t.get<int32_t>());
      }
    } else {
      return Invalid(
          "'prompt' must be a string, one string in an array, or an array of "
          "token ids");
    }
  }

  int32_t max_tokens = 0;
  RETURN_IF_ERROR(Get(body, "max_tokens", &max_tokens));
  if (chat) RETURN_IF_ERROR(Get(body, "max_completion_tokens", &max_tokens));
  // 0 is "the default" in the proto, an error here: the service's range and
  // words.
  const bool max_given =
      (body.contains("max_tokens") && !body["max_tokens"].is_null()) ||
      (chat && body.contains("max_completion_tokens") &&
       !body["max_completion_tokens"].is_null());
  if (max_given && max_tokens <= 0) {
    return CheckMaxTokens(max_tokens, context_length);
  }
  req.set_max_tokens(max_tokens);  // 0: the server's default.

  // OpenAI's defaults: temperature 1, top_p 1, a fresh seed per request.
  double temperature = 1.0, top_p = 1.0;
  int32_t top_k = 0;
  int64_t seed = -1;
  RETURN_IF_ERROR(Get(body, "temperature", &temperature));
  RETURN_IF_ERROR(Get(body, "top_p", &top_p));
  RETURN_IF_ERROR(Get(body, "top_k", &top_k));
  RETURN_IF_ERROR(Get(body, "seed", &seed));
  if (seed < 0) seed = static_cast<int64_t>(std::random_device()() >> 1);
  v1::SamplingParams& s = *req.mutable_sampling();
  s.set_temperature(static_cast<float>(temperature));
  s.set_top_p(static_cast<float>(top_p));
  s.set_top_k(top_k);  // The service refuses negatives, as over gRPC.
  s.set_seed(static_cast<uint64_t>(seed));
  // The penalties and logit_bias; the service checks their ranges (and
  // the bias's ids against the vocabulary), in the gRPC API's words.
  double presence = 0, frequency = 0, repetition = 1;
  RETURN_IF_ERROR(Get(body, "presence_penalty", &presence));
  RETURN_IF_ERROR(Get(body, "frequency_penalty", &frequency));
  RETURN_IF_ERROR(Get(body, "repetition_penalty", &repetition));
  s.set_presence_penalty(static_cast<float>(presence));
  s.set_frequency_penalty(static_cast<float>(frequency));
  // 0 reads as "off" in the proto: refused here, in the service's words.
  if (repetition == 0) {
    return Invalid(
        "sampling: repetition_penalty must be > 0 and finite, got 0");
  }
  s.set_repetition_penalty(static_cast<float>(repetition));
  RETURN_IF_ERROR(AddLogitBias(body, s));
  int32_t min_tokens = 0;
  RETURN_IF_ERROR(Get(body, "min_tokens", &min_tokens));
  req.set_min_tokens(min_tokens);

  const Json& stop = body.contains("stop") ? body["stop"] : Json();
  if (stop.is_string()) {
    req.add_stop(stop.get<std::string>());
  } else if (stop.is_array()) {
    for (const Json& x : stop) {
      if (!x.is_string()) return Invalid("'stop' must hold strings");
      req.add_stop(x.get<std::string>());
    }
  } else if (!stop.is_null()) {
    return Invalid("'stop' must be a string or an array of strings");
  }

  *top_n = -1;
  if (chat) {
    bool logprobs = false;
    int32_t top = 0;
    RETURN_IF_ERROR(Get(body, "logprobs", &logprobs));
    RETURN_IF_ERROR(Get(body, "top_logprobs", &top));
    if (top != 0 && !logprobs) {
      return Invalid("'top_logprobs' needs 'logprobs': true");
    }
    RETURN_IF_ERROR(CheckLogprobs(top));
    if (logprobs) *top_n = top;
  } else if (body.contains("logprobs") && !body["logprobs"].is_null()) {
    int32_t top = 0;
    RETURN_IF_ERROR(Get(body, "logprobs", &top));
    RETURN_IF_ERROR(CheckLogprobs(top));  // The gRPC API's range and words.
    *top_n = top;
  }
  // The service returns at least one alternative when asked for any.
  if (*top_n >= 0) req.set_logprobs(std::max(1, *top_n));
  // echo prepends the prompt to each choice's text; with logprobs, the
  // prompt tokens' logprobs lead each choice's (prompt_logprobs).
  if (echo) {
    if (*top_n >= 0) req.set_prompt_logprobs(std::max(1, *top_n));
    if (req.prompt_token_ids_size() > 0) {
      return Invalid("'echo' needs a text 'prompt', not token ids");
    }
    shape->echo_text = req.prompt();
  }
  // vLLM's prompt_logprobs k: per prompt token its own logprob and rank,
  // and the k most likely tokens there. The service is asked for all
  // kMaxLogprobs alternatives, so that the prompt token's rank is known
  // whenever it is among them.
  if (body.contains("prompt_logprobs") && !body["prompt_logprobs"].is_null()) {
    int64_t k = 0;
    RETURN_IF_ERROR(Get(body, "prompt_logprobs", &k));
    RETURN_IF_ERROR(CheckPromptLogprobs(k));  // The gRPC API's words.
    shape->prompt_top_n = static_cast<int>(k);
    req.set_prompt_logprobs(kMaxLogprobs);
  }

  bool ignore_eos = false;
  int32_t priority = 0, truncate = 0;
  RETURN_IF_ERROR(Get(body, "ignore_eos", &ignore_eos));
  RETURN_IF_ERROR(Get(body, "priority", &priority));
  RETURN_IF_ERROR(Get(body, "truncate_prompt_tokens", &truncate));
  req.set_ignore_eos(ignore_eos);
  req.set_priority(priority);
  req.set_truncate_prompt_tokens(truncate);
  if (echo && truncate != 0) {
    return Invalid("'echo' with 'truncate_prompt_tokens' is not supported");
  }
  RETURN_IF_ERROR(AddConstraint(body, raw_body, req));
  return req;
}

// OpenAI's usage object, with the prompt tokens the prefix cache held.
Json UsageJson(const v1::Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens()},
          {"completion_tokens", u.completion_tokens()},
          {"total_tokens", u.prompt_tokens() + u.completion_tokens()},
          {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens()}}}};
}

Json Bytes(const std::string& text) {
  Json b = Json::array();
  for (unsigned char c : text) b.push_back(c);
  return b;
}

// The prompt's tokens and log-probabilities (`r.prompt_logprobs`) in the
// completions format, from text offset 0; the first token's logprob and
// alternatives are null, as OpenAI's.
Json PromptLogprobsJson(const v1::GenerateResponse& r, int top_n) {
  Json out = {{"tokens", Json::array()},
              {"token_logprobs", Json::array()},
              {"top_logprobs", Json::array()},
              {"text_offset", Json::array()}};
  int64_t offset = 0;
  for (int k = 0; k < r.prompt_logprobs_size(); ++k) {
    const v1::TokenLogprobs& lp = r.prompt_logprobs(k);
    Json top = Json::object();
    for (int i = 0; i < std::min(top_n, lp.top_size()); ++i) {
      top[lp.top(i).text()] = lp.top(i).logprob();
    }
    out["tokens"].push_back(lp.token().text());
    out["token_logprobs"].push_back(k == 0 ? Json()
                                           : Json(lp.token().logprob()));
    out["top_logprobs"].push_back(k == 0 ? Json() : top);
    out["text_offset"].push_back(offset);
    offset += static_cast<int64_t>(lp.token().text().size());
  }
  return out;
}

// vLLM's prompt_logprobs from the service's (`r.prompt_logprobs`, one per
// prompt token): null for the first token (nothing precedes it), then per
// token an object of token id (decimal) to {logprob, rank, decoded_token}
// holding the prompt token and the `k` most likely tokens there. A rank is
// the position among the most likely (from 1, lower id first on ties); the
// prompt token's is null when it is not among the alternatives returned.
Json VllmPromptLogprobsJson(const v1::GenerateResponse& r, int k) {
  Json out = Json::array();
  for (int p = 0; p < r.prompt_logprobs_size(); ++p) {
    if (p == 0) {
      out.push_back(Json());
      continue;
    }
    const v1::TokenLogprobs& lp = r.prompt_logprobs(p);
    const auto one = [](const v1::TokenLogprob& t, const Json& rank) {
      return Json{{"logprob", t.logprob()},
                  {"rank", rank},
                  {"decoded_token", t.text()}};
    };
    Json rank;
    for (int i = 0; i < lp.top_size() && rank.is_null(); ++i) {
      if (lp.top(i).token_id() == lp.token().token_id()) rank = i + 1;
    }
    Json entry = {
        {std::to_string(lp.token().token_id()), one(lp.token(), rank)}};
    for (int i = 0; i < std::min(k, lp.top_size()); ++i) {
      entry.emplace(std::to_string(lp.top(i).token_id()),
                    one(lp.top(i), i + 1));
    }
    out.push_back(std::move(entry));
  }
  return out;
}

// Log-probabilities of the tokens of one response, in the completions
// ("tokens", "token_logprobs", ...) or chat ("content": [...]) format.
// `offset` is the running text offset of completions.
void AppendLogprobs(const v1::GenerateResponse& r, bool chat, int top_n,
                    Json& out, int64_t* offset) {
  for (const v1::TokenLogprobs& lp : r.logprobs()) {
    const auto& tok = lp.token();
    if (chat) {
      Json top = Json::array();
      for (int i = 0; i < std::min(top_n, lp.top_size()); ++i) {
        top.push_back({{"token", lp.top(i).text()},
                       {"logprob", lp.top(i).logprob()},
                       {"bytes", Bytes(lp.top(i).text())}});
      }
      out["content"].push_back({{"token", tok.text()},
                                {"logprob", tok.logprob()},
                                {"bytes", Bytes(tok.text())},
                                {"top_logprobs", top}});
    } else {
      Json top = Json::object();
      for (int i = 0; i < std::min(top_n, lp.top_size()); ++i) {
        top[lp.top(i).text()] = lp.top(i).logprob();
      }
      out["tokens"].push_back(tok.text());
      out["token_logprobs"].push_back(tok.logprob());
      out["top_logprobs"].push_back(top);
      out["text_offset"].push_back(*offset);
      *offset += static_cast<int64_t>(tok.text().size());
    }
  }
}

Json EmptyLogprobs(bool chat) {
  if (chat) return {{"content", Json::array()}};
  return {{"tokens", Json::array()},
          {"token_logprobs", Json::array()},
          {"top_logprobs", Json::array()},
          {"text_offset", Json::array()}};
}

}  // namespace

int HttpStatusFor(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk:
      return 200;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kFailedPrecondition:
      return 400;
    case absl::StatusCode::kUnauthenticated:
      return 401;
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kResourceExhausted:
      return 429;
    case absl::StatusCode::kCancelled:
      return 499;
    case absl::StatusCode::kUnavailable:
      return 503;
    case absl::StatusCode::kDeadlineExceeded:
      return 504;
    default:
      return 500;
  }
}

OpenAiApi::OpenAiApi(Engine* engine, InferenceService* service,
                     OpenAiApiOptions options)
    : engine_(engine),
      service_(service),
      run_([service](
               const v1::GenerateRequest& request, absl::Time deadline,
               const std::function<bool()>& cancelled,
               const std::function<bool(const v1::GenerateResponse&)>& write,
               RequestApi api) {
        return service->Run(request, deadline, cancelled, write, api);
      }),
      context_length_(engine->config().context_length),
      options_(std::move(options)),
      responses_(std::make_unique<ResponseStore>()) {}

OpenAiApi::OpenAiApi(CompletionRunner run, int64_t context_length,
                     OpenAiApiOptions options)
    : engine_(nullptr),
      service_(nullptr),
      run_(std::move(run)),
      context_length_(context_length),
      options_(std::move(options)),
      responses_(std::make_unique<ResponseStore>()) {}

OpenAiApi::~OpenAiApi() = default;

// What Handle answers a /v1/ request without the key.
constexpr char kMissingKey[] =
    "missing or wrong API key (Authorization: Bearer <key>)";

bool OpenAiApi::KeyOk(const HttpRequest& req) const {
  if (ApiKeyMatches(req.Header("authorization"), options_.api_key)) {
    return true;
  }
  const std::string x_api_key = req.Header("x-api-key");
  return !x_api_key.empty() &&
         ApiKeyMatches(absl::StrCat("Bearer ", x_api_key), options_.api_key);
}

std::optional<HttpRefusal> OpenAiApi::CheckHead(const HttpRequest& head) {
  if (!absl::StartsWith(head.path, "/v1/") || KeyOk(head)) {
    return std::nullopt;
  }
  http_client_error_++;
  const absl::Status missing = absl::UnauthenticatedError(kMissingKey);
  return HttpRefusal{.status = 401,
                     .body = head.path == "/v1/messages"
                                 ? MessagesErrorJson(missing)
                                 : ErrorJson(missing),
                     .headers = {{"WWW-Authenticate", "Bearer"}}};
}

void OpenAiApi::Handle(const HttpRequest& req, HttpResponse& res) {
  const auto send = [&](int status, const std::string& type,
                        const std::string& body) {
    (status < 400   ? http_ok_
     : status < 500 ? http_client_error_
                    : http_server_error_)++;
    res.Send(status, type, body);
  };
  const auto fail = [&](const absl::Status& s) {
    send(HttpStatusFor(s.code()), "application/json", ErrorJson(s));
  };
  const bool get = req.method == "GET", post = req.method == "POST";
  if (req.path == "/health") {
    // Live: the process answers.
    return send(200, "text/plain", "ok\n");
  }
  if (req.path == "/ready" && engine_ != nullptr) {
    if (absl::Status s = Ready(); !s.ok()) return fail(s);
    return send(200, "text/plain", "ready\n");
  }
  if (req.path == "/metrics" && get && engine_ != nullptr) {
    if (options_.metrics_auth &&
        !ApiKeyMatches(req.Header("authorization"), options_.api_key)) {
      res.AddHeader("WWW-Authenticate", "Bearer");
      return fail(absl::UnauthenticatedError(
          "/metrics needs the API key (Authorization: Bearer <key>)"));
    }
    return send(200, "text/plain; version=0.0.4", Metrics());
  }
  if (!absl::StartsWith(req.path, "/v1/")) {
    return fail(absl::NotFoundError(absl::StrCat("no route ", Echo(req.path))));
  }
  if (!KeyOk(req)) {
    res.AddHeader("WWW-Authenticate", "Bearer");
    if (req.path == "/v1/messages") {
      return send(401, "application/json",
                  MessagesErrorJson(absl::UnauthenticatedError(kMissingKey)));
    }
    return fail(absl::UnauthenticatedError(kMissingKey));
  }
  if (req.path == "/v1/models" && get) {
    const Json body = {{"object", "list"},
                       {"data",
                        {{{"id", options_.model_name},
                          {"object", "model"},
                          {"created", 0},
                          {"owned_by", "shardlm"},
                          {"max_model_len", context_length_}}}}};
    return send(200, "application/json", Dump(body));
  }
  const bool completions = req.path == "/v1/completions";
  const bool chat = req.path == "/v1/chat/completions";
  const bool messages = req.path == "/v1/messages";
  const bool responses = req.path == "/v1/responses";
  if ((completions || chat) && post) return Complete(req, res, chat);
  if (messages && post) return Messages(req, res);
  if (responses && post) return Responses(req, res);
  if (completions || chat || messages || responses ||
      req.path == "/v1/models") {
    res.AddHeader(
        "Allow", completions || chat || messages || responses ? "POST" : "GET");
    return send(405, "application/json",
                ErrorJson(absl::InvalidArgumentError(
                    absl::StrCat(Echo(req.method), " is not allowed here"))));
  }
  fail(absl::NotFoundError(absl::StrCat("no route ", Echo(req.path))));
}

void OpenAiApi::Complete(const HttpRequest& req, HttpResponse& res, bool chat) {
  const auto fail = [&](const absl::Status& s) {
    (HttpStatusFor(s.code()) < 500 ? http_client_error_ : http_server_error_)++;
    if (s.code() == absl::StatusCode::kResourceExhausted) {
      res.AddHeader("Retry-After", "1");
    }
    res.Send(HttpStatusFor(s.code()), "application/json", ErrorJson(s));
  };
  // Counts first, keeping nothing: the DOM below costs tens of bytes per
  // element, so a body of millions of tiny elements is refused before it
  // exists.
  OpenAiScanStats scanned;
  if (absl::Status s = ScanOpenAiRequest(req.body, {}, &scanned); !s.ok()) {
    return fail(s);
  }
  // The DOM, and the request built from it, are paid for before they exist.
  MemoryShare parse_share;
  if (options_.memory_budget != nullptr) {
    absl::StatusOr<MemoryShare> share = options_.memory_budget->Take(
        static_cast<int64_t>(scanned.values) * kDomBytesPerValue +
            2 * static_cast<int64_t>(req.body.size()),
        "parsing the JSON body");
    if (!share.ok()) return fail(share.status());
    parse_share = *std::move(share);
  }
  const Json body = Json::parse(req.body, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded() || !body.is_object()) {
    return fail(Invalid("the body is not a JSON object"));
  }
  ResponseShape shape;
  absl::StatusOr<v1::GenerateRequest> proto = ToProto(
      body, req.body, chat, options_.model_name, context_length_, &shape);
  if (!proto.ok()) return fail(proto.status());
  const int top_n = shape.top_n;
  const std::string& echo_text = shape.echo_text;
  bool stream = false;
  if (absl::Status s = Get(body, "stream", &stream); !s.ok()) return fail(s);
  // As vLLM: prompt_logprobs are in the whole response only.
  if (stream && shape.prompt_top_n >= 0) {
    return fail(Invalid("'prompt_logprobs' is not supported with 'stream'"));
  }
  // OpenAI's stream_options.include_usage: one more chunk before [DONE],
  // with no choices and the request's usage.
  bool include_usage = false;
  if (body.contains("stream_options") && !body["stream_options"].is_null()) {
    const Json& options = body["stream_options"];
    if (!stream) {
      return fail(Invalid("'stream_options' needs 'stream': true"));
    }
    if (!options.is_object()) {
      return fail(Invalid("'stream_options' must be an object"));
    }
    if (absl::Status s = Get(options, "include_usage", &include_usage);
        !s.ok()) {
      return fail(Invalid("'stream_options.include_usage' must be a boolean"));
    }
  }

  const std::string id =
      absl::StrCat(chat ? "chatcmpl-" : "cmpl-",
                   absl::ToUnixMicros(absl::Now()), "-", next_id_++);
  const int64_t created = absl::ToUnixSeconds(absl::Now());
  const char* object =
      chat ? (stream ? "chat.completion.chunk" : "chat.completion")
           : "text_completion";
  // What each of the n choices accumulates (the whole answer when not
  // streamed). Tool calls: the service parses them (the last response
  // carries them); the same parser here keeps their markup out of the
  // content.
  struct Choice {
    std::string text;
    Json logprobs;
    int64_t text_offset = 0;
    std::string finish_reason;
    bool first_chunk = true;
    std::optional<ToolCallStream> tool_filter;
    std::string reasoning;  // Unstreamed answers' reasoning.
    Json tool_calls = Json::array();
    int streamed_calls = 0;        // Tool calls sent as deltas so far.
    bool echoed_logprobs = false;  // The prompt's logprobs are in.
    v1::Usage usage;
  };
  const int n = std::max(1, proto->n());
  std::vector<Choice> choices(n);
  std::vector<std::string> names;
  if (chat) {
    // Without an engine (the router) the replica's template is unknown: a
    // replica whose template renders no tools refuses them.
    names = service_ != nullptr ? service_->ToolCallNames(*proto)
                                : RequestedToolCallNames(*proto);
  }
  ToolCallFormat format = options_.tool_call_format;
  ReasoningFormat reasoning_format = options_.reasoning_format;
  if (service_ != nullptr) {
    format = service_->tool_call_format();
    reasoning_format = service_->reasoning_format();
  }
  reasoning_format = RequestReasoningFormat(
      reasoning_format, proto->has_enable_thinking()
                            ? std::optional<bool>(proto->enable_thinking())
                            : std::nullopt);
  if (format == ToolCallFormat::kNone) format = ToolCallFormat::kHermes;
  for (Choice& c : choices) {
    c.text = echo_text;  // Streamed, it leads the choice's first chunk.
    c.text_offset = static_cast<int64_t>(echo_text.size());
    c.logprobs = EmptyLogprobs(chat);
    // Reasoning (harmony's channels, Qwen3's <think>) is split whether or
    // not tools are asked for.
    if (!names.empty() ||
        (chat && (format == ToolCallFormat::kHarmony ||
                  reasoning_format != ReasoningFormat::kNone))) {
      c.tool_filter.emplace(names, format, reasoning_format);
    }
  }
  // One usage for the request: the prompt once, every choice's tokens.
  const auto total_usage = [&] {
    v1::Usage u = choices[0].usage;
    for (int i = 1; i < n; ++i) {
      u.set_completion_tokens(u.completion_tokens() +
                              choices[i].usage.completion_tokens());
    }
    return u;
  };
  bool started = false;
  const auto calls_json = [](const v1::GenerateResponse& r) {
    Json calls = Json::array();
    for (int i = 0; i < r.tool_calls_size(); ++i) {
      const v1::ToolCall& c = r.tool_calls(i);
      calls.push_back(
          {{"id", c.id()},
           {"type", "function"},
           {"function", {{"name", c.name()}, {"arguments", c.arguments()}}}});
    }
    return calls;
  };
  // Streamed calls are named here (the service names the calls of its
  // last response, which a stream has sent as deltas by then).
  const std::string call_id_prefix = absl::StrCat(
      "call_", absl::Hex(absl::ToUnixNanos(absl::Now()) ^ next_id_++), "_");

  // echo with logprobs: the prompt's, from the request's first response
  // (whichever choice's), leading every choice's logprobs; and vLLM's
  // prompt_logprobs, from the same response.
  Json prompt_logprobs, vllm_prompt_logprobs;
  const bool echo_logprobs = shape.echo && top_n >= 0;
  // Calls to it are serialized (with n > 1, from several threads).
  const auto write = [&](const v1::GenerateResponse& r) {
    if (r.index() < 0 || r.index() >= n) return false;
    Choice& c = choices[r.index()];
    if (r.prompt_logprobs_size() > 0) {
      if (echo_logprobs) prompt_logprobs = PromptLogprobsJson(r, top_n);
      if (shape.prompt_top_n >= 0) {
        vllm_prompt_logprobs = VllmPromptLogprobsJson(r, shape.prompt_top_n);
      }
    }
    // The logprobs this response's piece starts from: the prompt's first.
    Json lead = EmptyLogprobs(chat);
    if (echo_logprobs && !c.echoed_logprobs && prompt_logprobs.is_object()) {
      c.echoed_logprobs = true;
      lead = prompt_logprobs;
    }
    if (r.has_usage()) c.usage = r.usage();
    if (!r.finish_reason().empty()) c.finish_reason = r.finish_reason();
    std::string piece = r.text();
    std::string reasoning;             // Harmony's analysis, Qwen3's <think>.
    std::vector<ChatToolCall> closed;  // Calls whose </tool_call> came now.
    if (c.tool_filter) {
      ToolCallEvents events = c.tool_filter->Push(r.text());
      piece = std::move(events.content);
      reasoning = std::move(events.reasoning);
      closed = std::move(events.calls);
      if (!r.finish_reason().empty()) {
        events = c.tool_filter->Finish();
        piece += events.content;
        reasoning += events.reasoning;
        for (ChatToolCall& call : events.calls)
          closed.push_back(std::move(call));
      }
    }
    if (!stream) {
      c.text += piece;
      c.reasoning += reasoning;
      if (r.tool_calls_size() > 0) c.tool_calls = calls_json(r);
      if (top_n >= 0) {
        if (!chat && !lead["tokens"].empty()) {
          for (const char* key :
               {"tokens", "token_logprobs", "top_logprobs", "text_offset"}) {
            for (Json& v : lead[key]) c.logprobs[key].push_back(std::move(v));
          }
        }
        AppendLogprobs(r, chat, top_n, c.logprobs, &c.text_offset);
      }
      return true;
    }
    Json choice = {
        {"index", r.index()},
        {"finish_reason",
         r.finish_reason().empty() ? Json() : Json(r.finish_reason())}};
    if (top_n >= 0) {
      Json lp = std::move(lead);
      AppendLogprobs(r, chat, top_n, lp, &c.text_offset);
      choice["logprobs"] = lp;
    } else {
      choice["logprobs"] = Json();
    }
    // Tool calls stream as OpenAI's do: a call's first delta carries its
    // index, id, type, name and empty arguments, the next its arguments.
    // Each call is sent when its </tool_call> arrives, arguments whole: a
    // malformed call must come back as content, which is known only then.
    std::vector<Json> call_deltas;
    for (ChatToolCall& call : closed) {
      const int k = c.streamed_calls++;
      call_deltas.push_back(
          {{"index", k},
           {"id", absl::StrCat(call_id_prefix, r.index(), "_", k)},
           {"type", "function"},
           {"function", {{"name", call.name}, {"arguments", ""}}}});
      call_deltas.push_back(
          {{"index", k}, {"function", {{"arguments", call.arguments}}}});
    }
    // One chunk per delta: the text first (with the logprobs), then the
    // call deltas; the last chunk has the finish_reason and usage.
    const size_t chunks = chat ? 1 + call_deltas.size() : 1;
    for (size_t i = 0; i < chunks; ++i) {
      Json one = choice;
      if (i > 0 && top_n >= 0) one["logprobs"] = EmptyLogprobs(chat);
      if (i + 1 < chunks) one["finish_reason"] = Json();
      if (chat) {
        Json delta = Json::object();
        if (i == 0 && !reasoning.empty())
          delta["reasoning_content"] = reasoning;
        if (i == 0) delta["content"] = piece;
        if (c.first_chunk) delta["role"] = "assistant";
        if (i > 0) delta["tool_calls"] = Json::array({call_deltas[i - 1]});
        one["delta"] = std::move(delta);
      } else {
        one["text"] = c.first_chunk ? echo_text + r.text() : r.text();
      }
      c.first_chunk = false;
      // The text chunk of a piece that was all tool-call markup is empty:
      // skipped when call deltas follow.
      if (chat && i == 0 && chunks > 1 && piece.empty() &&
          !one["delta"].contains("role") && top_n < 0) {
        continue;
      }
      Json chunk = {{"id", id},
                    {"object", object},
                    {"created", created},
                    {"model", options_.model_name},
                    {"choices", {one}}};
      // With n > 1 the request's usage is in the include_usage chunk only.
      if (r.has_usage() && n == 1 && i + 1 == chunks) {
        chunk["usage"] = UsageJson(r.usage());
      }
      if (!started) {
        started = true;
        if (!res.Start(200, "text/event-stream")) return false;
      }
      if (!res.Write(absl::StrCat("data: ", Dump(chunk), "\n\n"))) {
        return false;
      }
    }
    return true;
  };
  const absl::Status status = run_(
      *proto, absl::InfiniteFuture(), [&] { return res.ClientGone(); }, write,
      RequestApi::kHttp);
  if (!status.ok()) {
    if (!started) return fail(status);
    // Mid-stream: the status line is gone; say it in the stream.
    http_server_error_++;
    res.Write(absl::StrCat("data: ", ErrorJson(status), "\n\n"));
    return;
  }
  if (stream) {
    http_ok_++;
    if (include_usage) {
      const Json last = {{"id", id},
                         {"object", object},
                         {"created", created},
                         {"model", options_.model_name},
                         {"choices", Json::array()},
                         {"usage", UsageJson(total_usage())}};
      res.Write(absl::StrCat("data: ", Dump(last), "\n\n"));
    }
    res.Write("data: [DONE]\n\n");
    return;
  }
  Json out_choices = Json::array();
  for (int i = 0; i < n; ++i) {
    const Choice& c = choices[i];
    Json choice = {{"index", i},
                   {"finish_reason", c.finish_reason},
                   {"logprobs", top_n >= 0 ? c.logprobs : Json()}};
    if (chat) {
      choice["message"] = {{"role", "assistant"}, {"content", c.text}};
      // The reasoning (harmony's analysis channel) in the field DeepSeek's
      // API and vLLM use.
      if (!c.reasoning.empty()) {
        choice["message"]["reasoning_content"] = c.reasoning;
      }
      if (!c.tool_calls.empty()) {
        if (c.text.empty()) choice["message"]["content"] = Json();
        choice["message"]["tool_calls"] = c.tool_calls;
      }
    } else {
      choice["text"] = c.text;
      // vLLM puts a completion's prompt_logprobs in each choice.
      if (shape.prompt_top_n >= 0) {
        choice["prompt_logprobs"] = vllm_prompt_logprobs;
      }
    }
    out_choices.push_back(std::move(choice));
  }
  Json out = {{"id", id},
              {"object", object},
              {"created", created},
              {"model", options_.model_name},
              {"choices", out_choices},
              {"usage", UsageJson(total_usage())}};
  // ... and a chat's beside the choices.
  if (chat && shape.prompt_top_n >= 0) {
    out["prompt_logprobs"] = vllm_prompt_logprobs;
  }
  http_ok_++;
  res.Send(200, "application/json", Dump(out));
}

void OpenAiApi::Messages(const HttpRequest& req, HttpResponse& res) {
  const auto fail = [&](const absl::Status& s) {
    (HttpStatusFor(s.code()) < 500 ? http_client_error_ : http_server_error_)++;
    if (s.code() == absl::StatusCode::kResourceExhausted) {
      res.AddHeader("Retry-After", "1");
    }
    res.Send(HttpStatusFor(s.code()), "application/json", MessagesErrorJson(s));
  };
  // The same bounds as a chat body's, before any DOM exists; the chat
  // body made from it is bounded by it (a few bytes more per message).
  OpenAiScanStats scanned;
  if (absl::Status s = ScanOpenAiRequest(req.body, {}, &scanned); !s.ok()) {
    return fail(s);
  }
  MemoryShare parse_share;
  if (options_.memory_budget != nullptr) {
    absl::StatusOr<MemoryShare> share = options_.memory_budget->Take(
        2 * (static_cast<int64_t>(scanned.values) * kDomBytesPerValue +
             2 * static_cast<int64_t>(req.body.size())),
        "parsing the JSON body");
    if (!share.ok()) return fail(share.status());
    parse_share = *std::move(share);
  }
  absl::StatusOr<std::string> chat_body = MessagesToChatBody(req.body);
  if (!chat_body.ok()) return fail(chat_body.status());
  const Json body = Json::parse(*chat_body, nullptr, false);
  ResponseShape shape;
  absl::StatusOr<v1::GenerateRequest> proto =
      ToProto(body, *chat_body, /*chat=*/true, options_.model_name,
              context_length_, &shape);
  if (!proto.ok()) return fail(proto.status());
  bool stream = false;
  if (absl::Status s = Get(body, "stream", &stream); !s.ok()) return fail(s);

  const int64_t serial = next_id_++;
  const std::string id =
      absl::StrCat("msg_", absl::ToUnixMicros(absl::Now()), "_", serial);
  MessageBlocks blocks(absl::StrCat("toolu_", absl::ToUnixMicros(absl::Now()),
                                    "_", serial, "_"));
  const std::vector<std::string> names = service_ != nullptr
                                             ? service_->ToolCallNames(*proto)
                                             : RequestedToolCallNames(*proto);
  ToolCallFormat format = options_.tool_call_format;
  ReasoningFormat reasoning_format = options_.reasoning_format;
  if (service_ != nullptr) {
    format = service_->tool_call_format();
    reasoning_format = service_->reasoning_format();
  }
  reasoning_format = RequestReasoningFormat(
      reasoning_format, proto->has_enable_thinking()
                            ? std::optional<bool>(proto->enable_thinking())
                            : std::nullopt);
  if (format == ToolCallFormat::kNone) format = ToolCallFormat::kHermes;
  // Every output goes through the parsers (an empty tool list parses no
  // calls), so that reasoning, text and calls become blocks.
  ToolCallStream filter(names, format, reasoning_format);
  std::string finish_reason, stop_sequence;
  v1::Usage usage;
  bool started = false;
  const auto send_events = [&](const MessageBlocks::Events& events) {
    for (const auto& [event, data] : events) {
      if (!res.Write(
              absl::StrCat("event: ", event, "\ndata: ", Dump(data), "\n\n"))) {
        return false;
      }
    }
    return true;
  };
  const auto message = [&](const Json& content, const Json& stop_reason,
                           const Json& stop_seq, const v1::Usage& u) {
    return Json{{"id", id},
                {"type", "message"},
                {"role", "assistant"},
                {"model", options_.model_name},
                {"content", content},
                {"stop_reason", stop_reason},
                {"stop_sequence", stop_seq},
                {"usage",
                 {{"input_tokens", u.prompt_tokens()},
                  {"output_tokens", u.completion_tokens()},
                  {"cache_read_input_tokens", u.cached_tokens()}}}};
  };
  const auto write = [&](const v1::GenerateResponse& r) {
    if (r.has_usage()) usage = r.usage();
    if (!r.finish_reason().empty()) {
      finish_reason = r.finish_reason();
      stop_sequence = r.stop_sequence();
    }
    ToolCallEvents pieces = filter.Push(r.text());
    if (!r.finish_reason().empty()) {
      ToolCallEvents rest = filter.Finish();
      pieces.content += rest.content;
      pieces.reasoning += rest.reasoning;
      for (ChatToolCall& call : rest.calls) pieces.calls.push_back(call);
    }
    const MessageBlocks::Events events = blocks.Push(pieces);
    if (!stream) return true;
    if (!started) {
      started = true;
      if (!res.Start(200, "text/event-stream")) return false;
      // The prompt's size is known at the end only: message_delta has it.
      const Json start = {
          {"type", "message_start"},
          {"message", message(Json::array(), Json(), Json(), v1::Usage())}};
      if (!send_events({{"message_start", start}})) return false;
    }
    return send_events(events);
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
    res.Send(200, "application/json",
             Dump(message(blocks.content(), stop_reason, stop_seq, usage)));
    return;
  }
  if (!started) {  // No response came (cannot happen: the last one ends it).
    started = true;
    if (!res.Start(200, "text/event-stream")) return;
  }
  send_events(last);
  send_events(
      {{"message_delta",
        {{"type", "message_delta"},
         {"delta", {{"stop_reason", stop_reason}, {"stop_sequence", stop_seq}}},
         {"usage",
          {{"input_tokens", usage.prompt_tokens()},
           {"output_tokens", usage.completion_tokens()},
           {"cache_read_input_tokens", usage.cached_tokens()}}}}},
       {"message_stop", {{"type", "message_stop"}}}});
}

void OpenAiApi::Responses(const HttpRequest& req, HttpResponse& res) {
  const auto fail = [&](const absl::Status& s) {
    (HttpStatusFor(s.code()) < 500 ? http_client_error_ : http_server_error_)++;
    if (s.code() == absl::StatusCode::kResourceExhausted) {
      res.AddHeader("Retry-After", "1");
    }
    res.Send(HttpStatusFor(s.code()), "application/json", ErrorJson(s));
  };
  OpenAiScanStats scanned;
  if (absl::Status s = ScanOpenAiRequest(req.body, {}, &scanned); !s.ok()) {
    return fail(s);
  }
  MemoryShare parse_share;
  if (options_.memory_budget != nullptr) {
    // The body's DOM and the chat body's (the previous response's
    // conversation is bounded by the store).
    absl::StatusOr<MemoryShare> share = options_.memory_budget->Take(
        2 * (static_cast<int64_t>(scanned.values) * kDomBytesPerValue +
             2 * static_cast<int64_t>(req.body.size())),
        "parsing the JSON body");
    if (!share.ok()) return fail(share.status());
    parse_share = *std::move(share);
  }
  absl::StatusOr<ResponsesRequest> translated =
      ResponsesToChatBody(req.body, *responses_);
  if (!translated.ok()) return fail(translated.status());
  const Json body = Json::parse(translated->chat_body, nullptr, false);
  ResponseShape shape;
  absl::StatusOr<v1::GenerateRequest> proto =
      ToProto(body, translated->chat_body, /*chat=*/true, options_.model_name,
              context_length_, &shape);
  if (!proto.ok()) return fail(proto.status());
  bool stream = false;
  if (absl::Status s = Get(body, "stream", &stream); !s.ok()) return fail(s);

  const std::string suffix =
      absl::StrCat(absl::ToUnixMicros(absl::Now()), "_", next_id_++);
  const std::string id = "resp_" + suffix;
  const int64_t created = absl::ToUnixSeconds(absl::Now());
  ResponseItems items(suffix);
  const std::vector<std::string> names = service_ != nullptr
                                             ? service_->ToolCallNames(*proto)
                                             : RequestedToolCallNames(*proto);
  ToolCallFormat format = options_.tool_call_format;
  ReasoningFormat reasoning_format = options_.reasoning_format;
  if (service_ != nullptr) {
    format = service_->tool_call_format();
    reasoning_format = service_->reasoning_format();
  }
  reasoning_format = RequestReasoningFormat(
      reasoning_format, proto->has_enable_thinking()
                            ? std::optional<bool>(proto->enable_thinking())
                            : std::nullopt);
  if (format == ToolCallFormat::kNone) format = ToolCallFormat::kHermes;
  ToolCallStream filter(names, format, reasoning_format);
  std::string finish_reason;
  v1::Usage usage;
  bool started = false;
  int64_t sequence = 0;
  const Json& echo = translated->echo;
  // The response object: its status, output and usage, and the request's
  // fields it repeats.
  const auto response = [&](const std::string& status, const Json& output,
                            const v1::Usage* u) {
    const auto field = [&](const char* key, Json fallback) {
      return echo.contains(key) ? echo[key] : fallback;
    };
    Json r = {{"id", id},
              {"object", "response"},
              {"created_at", created},
              {"status", status},
              {"error", Json()},
              {"incomplete_details", status == "incomplete"
                                         ? Json{{"reason", "max_output_tokens"}}
                                         : Json()},
              {"model", options_.model_name},
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
              {"store", translated->store},
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
  };
  const auto send_events = [&](const ResponseItems::Events& events) {
    for (Json event : events) {
      event["sequence_number"] = sequence++;
      if (!res.Write(absl::StrCat("event: ", event["type"].get<std::string>(),
                                  "\ndata: ", Dump(event), "\n\n"))) {
        return false;
      }
    }
    return true;
  };
  const auto write = [&](const v1::GenerateResponse& r) {
    if (r.has_usage()) usage = r.usage();
    if (!r.finish_reason().empty()) finish_reason = r.finish_reason();
    ToolCallEvents pieces = filter.Push(r.text());
    if (!r.finish_reason().empty()) {
      ToolCallEvents rest = filter.Finish();
      pieces.content += rest.content;
      pieces.reasoning += rest.reasoning;
      for (ChatToolCall& call : rest.calls) pieces.calls.push_back(call);
    }
    const ResponseItems::Events events = items.Push(pieces);
    if (!stream) return true;
    if (!started) {
      started = true;
      if (!res.Start(200, "text/event-stream")) return false;
      const Json initial = response("in_progress", Json::array(), nullptr);
      if (!send_events(
              {{{"type", "response.created"}, {"response", initial}},
               {{"type", "response.in_progress"}, {"response", initial}}})) {
        return false;
      }
    }
    return send_events(events);
  };
  const absl::Status status = run_(
      *proto, absl::InfiniteFuture(), [&] { return res.ClientGone(); }, write,
      RequestApi::kHttp);
  if (!status.ok()) {
    if (!started) return fail(status);
    http_server_error_++;
    Json error = Json::parse(ErrorJson(status))["error"];
    error["type"] = "error";
    send_events({error});
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
    res.Send(200, "application/json", Dump(whole));
    return;
  }
  if (!started) {
    started = true;
    if (!res.Start(200, "text/event-stream")) return;
  }
  send_events(last);
  send_events({{{"type", final_status == "completed" ? "response.completed"
                                                     : "response.incomplete"},
                {"response", whole}}});
}

absl::Status OpenAiApi::Ready() {
  if (service_->draining()) {
    return absl::UnavailableError("draining: shutting down");
  }
  RETURN_IF_ERROR(engine_->executor().Health());
  // Making progress: with requests in the engine, steps advance.
  const SchedulerStats s = engine_->stats();
  const absl::Time now = absl::Now();
  absl::MutexLock lock(&ready_mu_);
  if (s.steps != last_steps_ || s.running + s.waiting == 0) {
    last_steps_ = s.steps;
    last_progress_ = now;
    return absl::OkStatus();
  }
  if (now - last_progress_ > options_.stall_timeout) {
    return absl::UnavailableError(absl::StrCat(
        "no step in ", absl::FormatDuration(now - last_progress_), " with ",
        s.running, " requests running and ", s.waiting, " waiting"));
  }
  return absl::OkStatus();
}

std::string OpenAiApi::Metrics() {
  const bool ready = Ready().ok();
  const SchedulerStats s = engine_->stats();
  std::string out;
  const auto metric = [&](const char* name, const char* type, const char* help,
                          std::vector<std::pair<std::string, int64_t>> values) {
    absl::StrAppend(&out, "# HELP ", name, " ", help, "\n# TYPE ", name, " ",
                    type, "\n");
    for (const auto& [labels, v] : values) {
      absl::StrAppend(&out, name, labels.empty() ? "" : "{", labels,
                      labels.empty() ? "" : "}", " ", v, "\n");
    }
  };
  metric("shardlm_ready", "gauge",
         "1 when /ready would answer 200 (every rank up, steps advancing "
         "while requests wait), else 0.",
         {{"", ready ? 1 : 0}});
  metric("shardlm_requests", "gauge", "Requests by state.",
         {{"state=\"running\"", s.running}, {"state=\"waiting\"", s.waiting}});
  metric("shardlm_kv_blocks", "gauge",
         "KV blocks by tier and state (used: held by sequences; cached: "
         "kept for prefix hits).",
         {{"tier=\"device\",state=\"used\"", s.device.used},
          {"tier=\"device\",state=\"cached\"", s.device.cached},
          {"tier=\"device\",state=\"free\"", s.device.free},
          {"tier=\"host\",state=\"used\"", s.host.used},
          {"tier=\"host\",state=\"cached\"", s.host.cached},
          {"tier=\"host\",state=\"free\"", s.host.free}});
  AppendCpRankKvMetrics(out, s.device_by_cp_rank, s.host_by_cp_rank);
  metric("shardlm_steps_total", "counter", "Forward steps run.",
         {{"", s.steps}});
  metric("shardlm_steps_in_flight", "gauge",
         "Steps submitted whose tokens are not back yet (pipeline stages "
         "working at once): now, and the most so far.",
         {{"which=\"now\"", s.steps_in_flight},
          {"which=\"max\"", s.max_steps_in_flight}});
  metric("shardlm_computed_tokens_total", "counter",
         "Tokens run through the model (prefix-cache hits are not).",
         {{"", s.computed_tokens}});
  metric("shardlm_preemptions_total", "counter", "Preemptions by kind.",
         {{"kind=\"swap\"", s.preempted_swap},
          {"kind=\"recompute\"", s.preempted_recompute}});
  metric("shardlm_interruptions_total", "counter",
         "Failed steps (a lost rank) after which the requests holding KV "
         "were kept to resume (coordinator --rejoin).",
         {{"", s.interruptions}});
  metric("shardlm_resumed_requests_total", "counter",
         "Requests put back in the queue after an interruption, to be "
         "recomputed from their tokens.",
         {{"", s.resumed}});
  metric("shardlm_recomputed_tokens_total", "counter",
         "Tokens of KV lost to interruptions (recomputed on resuming).",
         {{"", s.recomputed_tokens}});
  metric("shardlm_kv_checksum_failures_total", "counter",
         "Steps in which a KV block copied back from the host tier failed "
         "its checksum (--kv-checksum): their sequences were recomputed.",
         {{"", s.kv_checksum_failures}});
  metric("shardlm_kv_blocks_moved_total", "counter",
         "KV blocks copied between tiers.",
         {{"kind=\"swap_out\"", s.blocks.swapped_out},
          {"kind=\"swap_in\"", s.blocks.swapped_in},
          {"kind=\"spill\"", s.blocks.spilled},
          {"kind=\"offload\"", s.offloaded}});
  if (options_.metrics_prefix_cache) {
    metric("shardlm_prefix_cache_tokens_total", "counter",
           "Prompt tokens looked up in the prefix cache, and found.",
           {{"result=\"queried\"", s.blocks.prefix_queries},
            {"result=\"hit\"", s.blocks.prefix_hit_tokens}});
  }
  metric("shardlm_http_responses_total", "counter",
         "HTTP API responses by class.",
         {{"class=\"2xx\"", http_ok_.load()},
          {"class=\"4xx\"", http_client_error_.load()},
          {"class=\"5xx\"", http_server_error_.load()}});
  if (const MemoryBudget* b = options_.memory_budget; b != nullptr) {
    metric("shardlm_request_memory_bytes", "gauge",
           "The memory budget of requests in flight (--request-memory-mb): "
           "its limit, the bytes taken now, and the most taken at once.",
           {{"kind=\"limit\"", b->limit()},
            {"kind=\"in_use\"", b->in_use()},
            {"kind=\"peak\"", b->peak()}});
    metric("shardlm_invalid_utf8_total", "counter",
           "gRPC requests refused (INVALID_ARGUMENT) for invalid UTF-8 in a "
           "string field.",
           {{"", service_->invalid_utf8()}});
    metric("shardlm_request_memory_refused_total", "counter",
           "Requests refused because their share of the memory budget did "
           "not fit within 250 ms (429 / RESOURCE_EXHAUSTED).",
           {{"", b->refused()}});
  }
  metric("shardlm_kv_slots", "gauge",
         "Token slots of the KV blocks sequences hold, and how many hold a "
         "token (see shardlm_kv_fragmentation_ratio).",
         {{"state=\"allocated\"", s.kv_slots_allocated},
          {"state=\"filled\"", s.kv_slots_filled}});
  absl::StrAppend(
      &out,
      "# HELP shardlm_kv_fragmentation_ratio Slots allocated but not filled "
      "over slots allocated (0 when none is allocated).\n"
      "# TYPE shardlm_kv_fragmentation_ratio gauge\n"
      "shardlm_kv_fragmentation_ratio ",
      s.kv_slots_allocated == 0
          ? 0.0
          : 1.0 - static_cast<double>(s.kv_slots_filled) /
                      static_cast<double>(s.kv_slots_allocated),
      "\n");
  // Requests, tokens and latencies of both APIs (api="grpc"|"http").
  absl::StrAppend(&out, engine_->metrics().Prometheus());
  const std::vector<RankReport> ranks = engine_->executor().RankReports();
  AppendRankMetrics(out, ranks, service_->options().tp);
  AppendBuildInfo(out, engine_->executor().backend(),
                  KvCacheDTypeName(engine_->executor().kv_cache_dtype()),
                  std::max<int>(1, static_cast<int>(ranks.size())));
  return out;
}

}  // namespace shardlm
