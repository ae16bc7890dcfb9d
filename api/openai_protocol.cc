#include "api/openai_protocol.h"

#include <algorithm>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "api/openai_api.h"
#include "api/request_ranges.h"
#include "core/status.h"
#include "grammar/json_schema.h"
#include "model/tool_calls.h"
#include "step/kv_cache.h"
#include "step/step.h"

namespace shardlm::openai_wire {
namespace {

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

Json Bytes(const std::string& text) {
  Json b = Json::array();
  for (unsigned char c : text) b.push_back(c);
  return b;
}

// The model (NotFound when it is not this server's), n, best_of and echo.
absl::Status AddChoices(const Json& body, bool chat,
                        const std::string& model_name, v1::GenerateRequest& req,
                        bool& echo) {
  std::string model;
  RETURN_IF_ERROR(Get(body, "model", &model));
  if (!model.empty() && model != model_name) {
    return absl::NotFoundError(absl::StrCat("model '", Echo(model),
                                            "' is not served here (this "
                                            "server serves '",
                                            model_name, "')"));
  }
  int64_t n = 1, best_of = 1;
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
  return absl::OkStatus();
}

// A chat's messages, tools, reasoning_effort and chat_template_kwargs.
absl::Status AddChat(const Json& body, absl::string_view raw_body,
                     v1::GenerateRequest& req) {
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
  return AddChatTemplateKwargs(body, req);
}

// A completion's prompt: a string, one string in an array, or token ids
// (and none of the chat's fields).
absl::Status AddPrompt(const Json& body, v1::GenerateRequest& req) {
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
  return absl::OkStatus();
}

// max_tokens (a chat's max_completion_tokens too).
absl::Status AddMaxTokens(const Json& body, bool chat, int64_t context_length,
                          v1::GenerateRequest& req) {
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
  return absl::OkStatus();
}

// The sampling parameters, min_tokens and speculative.
absl::Status AddSampling(const Json& body, v1::GenerateRequest& req) {
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
  if (body.contains("speculative")) {
    bool speculative = true;
    RETURN_IF_ERROR(Get(body, "speculative", &speculative));
    req.set_speculative(speculative);
  }
  return absl::OkStatus();
}

// "stop": a string or an array of strings.
absl::Status AddStop(const Json& body, v1::GenerateRequest& req) {
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
  return absl::OkStatus();
}

// logprobs (completions) or logprobs and top_logprobs (chat), what echo
// shows, and vLLM's prompt_logprobs.
absl::Status AddLogprobFields(const Json& body, bool chat,
                              v1::GenerateRequest& req, ResponseShape& shape) {
  int* const top_n = &shape.top_n;
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
  if (shape.echo) {
    if (*top_n >= 0) req.set_prompt_logprobs(std::max(1, *top_n));
    if (req.prompt_token_ids_size() > 0) {
      return Invalid("'echo' needs a text 'prompt', not token ids");
    }
    shape.echo_text = req.prompt();
  }
  // vLLM's prompt_logprobs k: per prompt token its own logprob and rank,
  // and the k most likely tokens there. The service is asked for all
  // kMaxLogprobs alternatives, so that the prompt token's rank is known
  // whenever it is among them.
  if (body.contains("prompt_logprobs") && !body["prompt_logprobs"].is_null()) {
    int64_t k = 0;
    RETURN_IF_ERROR(Get(body, "prompt_logprobs", &k));
    RETURN_IF_ERROR(CheckPromptLogprobs(k));  // The gRPC API's words.
    shape.prompt_top_n = static_cast<int>(k);
    req.set_prompt_logprobs(kMaxLogprobs);
  }
  return absl::OkStatus();
}

}  // namespace

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

// The OpenAI request as a shardlm.v1 request, and what its response shows.
absl::StatusOr<v1::GenerateRequest> ToProto(const Json& body,
                                            absl::string_view raw_body,
                                            bool chat,
                                            const std::string& model_name,
                                            int64_t context_length,
                                            ResponseShape* shape) {
  v1::GenerateRequest req;
  RETURN_IF_ERROR(AddChoices(body, chat, model_name, req, shape->echo));
  RETURN_IF_ERROR(chat ? AddChat(body, raw_body, req) : AddPrompt(body, req));
  RETURN_IF_ERROR(AddMaxTokens(body, chat, context_length, req));
  RETURN_IF_ERROR(AddSampling(body, req));
  RETURN_IF_ERROR(AddStop(body, req));
  RETURN_IF_ERROR(AddLogprobFields(body, chat, req, *shape));

  bool ignore_eos = false;
  int32_t priority = 0, truncate = 0;
  RETURN_IF_ERROR(Get(body, "ignore_eos", &ignore_eos));
  RETURN_IF_ERROR(Get(body, "priority", &priority));
  RETURN_IF_ERROR(Get(body, "truncate_prompt_tokens", &truncate));
  req.set_ignore_eos(ignore_eos);
  req.set_priority(priority);
  req.set_truncate_prompt_tokens(truncate);
  if (shape->echo && truncate != 0) {
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

ToolCallEvents ParsePiece(ToolCallStream& parser,
                          const v1::GenerateResponse& r) {
  ToolCallEvents events = parser.Push(r.text());
  if (!r.finish_reason().empty()) {
    ToolCallEvents rest = parser.Finish();
    events.content += rest.content;
    events.reasoning += rest.reasoning;
    for (ChatToolCall& call : rest.calls)
      events.calls.push_back(std::move(call));
  }
  return events;
}

}  // namespace shardlm::openai_wire
