#include "api/engine_request_builder.h"

#include <algorithm>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"
#include "api/request_ranges.h"
#include "core/status.h"
#include "grammar/grammar_cache.h"
#include "grammar/json_schema.h"
#include "grammar/token_mask.h"
#include "model/chat_template.h"
#include "model/model_config.h"
#include "model/stop_tokens.h"
#include "model/tokenizer.h"
#include "nlohmann/json.hpp"
#include "shardlm/v1/inference.pb.h"
#include "step/sampling_params.h"

namespace shardlm {
namespace {

absl::Status Invalid(auto&&... parts) {
  return absl::InvalidArgumentError(absl::StrCat(parts...));
}

// How the model writes its calls (kNone: the template renders no tools).
ToolCallFormat OutputFormat(const absl::StatusOr<ChatTemplate>& chat_template) {
  if (!chat_template.ok()) return ToolCallFormat::kNone;
  return chat_template->output_format();
}

// Whether `name` may name a function: 1 to 64 of a-z, A-Z, 0-9, _ and -.
bool ValidToolName(const std::string& name) {
  return !name.empty() && name.size() <= 64 &&
         std::all_of(name.begin(), name.end(), [](char c) {
           return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                  (c >= '0' && c <= '9') || c == '_' || c == '-';
         });
}

// The checks of tools[i] alone (name, its uniqueness, parameters).
absl::Status CheckTool(const v1::GenerateRequest& request, int i) {
  const v1::Tool& tool = request.tools(i);
  const std::string& name = tool.name();
  if (!ValidToolName(name)) {
    return Invalid("tools[", i,
                   "].function.name must be 1 to 64 of a-z, A-Z, 0-9, _ "
                   "and -, got '",
                   name.substr(0, 80), "'");
  }
  for (int j = 0; j < i; ++j) {
    if (request.tools(j).name() == name) {
      return Invalid("tools[", i, "].function.name '", name, "' is also tools[",
                     j, "]'s");
    }
  }
  if (tool.parameters().size() > kMaxJsonSchemaBytes) {
    return Invalid("tools[", i, "].function.parameters is ",
                   tool.parameters().size(), " bytes; at most ",
                   kMaxJsonSchemaBytes, " are accepted");
  }
  if (!tool.parameters().empty()) {
    const nlohmann::json p = nlohmann::json::parse(tool.parameters(), nullptr,
                                                   /*allow_exceptions=*/false);
    if (!p.is_object()) {
      return Invalid("tools[", i,
                     "].function.parameters must be a JSON Schema object");
    }
  }
  return absl::OkStatus();
}

// Token ids of a repeated field (`field` names it) inside [0, vocab).
absl::Status CheckTokenIds(const google::protobuf::RepeatedField<int32_t>& ids,
                           const char* field, int64_t vocab) {
  for (int i = 0; i < ids.size(); ++i) {
    const int32_t t = ids.Get(i);
    if (t < 0 || t >= vocab) {
      return Invalid(field, "[", i, "] = ", t, " is outside the vocabulary of ",
                     vocab);
    }
  }
  return absl::OkStatus();
}

}  // namespace

EngineRequestBuilder::EngineRequestBuilder(
    const ModelConfig* config, const Tokenizer* tokenizer,
    const absl::StatusOr<ChatTemplate>* chat_template,
    int32_t default_max_tokens, size_t max_prompt_bytes)
    : config_(config),
      tokenizer_(tokenizer),
      chat_template_(chat_template),
      default_max_tokens_(default_max_tokens),
      max_prompt_bytes_(max_prompt_bytes),
      grammars_(tokenizer != nullptr ? std::make_unique<GrammarCache>(tokenizer)
                                     : nullptr) {}

EngineRequestBuilder::~EngineRequestBuilder() = default;

absl::StatusOr<GenerateRequest> EngineRequestBuilder::Build(
    const v1::GenerateRequest& request) const {
  GenerateRequest req;
  RETURN_IF_ERROR(SetSampling(request, req));
  RETURN_IF_ERROR(CheckStopStrings(request));
  RETURN_IF_ERROR(CheckTruncatePromptTokens(request.truncate_prompt_tokens()));
  // Sizes first: nothing below may cost more than the request's bytes.
  RETURN_IF_ERROR(CheckSizes(request));
  RETURN_IF_ERROR(SetPrompt(request, req));
  RETURN_IF_ERROR(SetStopTokens(request, req));
  RETURN_IF_ERROR(SetResumed(request, req));
  RETURN_IF_ERROR(AddConstraint(request, req));
  RETURN_IF_ERROR(AddToolConstraint(request, req));
  RETURN_IF_ERROR(AcceptResumed(req));
  return req;
}

absl::Status EngineRequestBuilder::SetSampling(
    const v1::GenerateRequest& request, GenerateRequest& req) const {
  req.max_tokens =
      request.max_tokens() == 0 ? default_max_tokens_ : request.max_tokens();
  if (!CheckMaxTokens(req.max_tokens, config_->context_length).ok()) {
    return CheckMaxTokens(request.max_tokens(), config_->context_length);
  }

  RETURN_IF_ERROR(CheckMinTokens(request.min_tokens(), req.max_tokens));
  req.min_tokens = request.min_tokens();
  req.speculative = !request.has_speculative() || request.speculative();

  const v1::SamplingParams& s = request.sampling();
  // In the proto, top_p and repetition_penalty 0 (the default) mean off,
  // like 1.
  req.sampling = {.temperature = s.temperature(),
                  .top_k = s.top_k(),
                  .top_p = s.top_p() == 0.0f ? 1.0f : s.top_p(),
                  .seed = s.seed(),
                  .presence_penalty = s.presence_penalty(),
                  .frequency_penalty = s.frequency_penalty(),
                  .repetition_penalty = s.repetition_penalty() == 0.0f
                                            ? 1.0f
                                            : s.repetition_penalty()};
  if (s.logit_bias_size() > kMaxLogitBias) {  // Before copying them.
    return Invalid("sampling: at most ", kMaxLogitBias,
                   " logit_bias entries, got ", s.logit_bias_size());
  }
  for (const auto& entry : s.logit_bias()) {
    req.sampling.logit_bias.push_back(
        {.token = entry.first, .bias = entry.second});
  }
  std::sort(
      req.sampling.logit_bias.begin(), req.sampling.logit_bias.end(),
      [](const LogitBias& a, const LogitBias& b) { return a.token < b.token; });
  RETURN_IF_ERROR(CheckSampling(req.sampling, config_->vocab_size));
  RETURN_IF_ERROR(CheckLogprobs(request.logprobs()));
  req.logprobs = request.logprobs();
  RETURN_IF_ERROR(CheckPromptLogprobs(request.prompt_logprobs()));
  req.prompt_logprobs = request.prompt_logprobs();
  return absl::OkStatus();
}

absl::Status EngineRequestBuilder::CheckStopStrings(
    const v1::GenerateRequest& request) const {
  if (request.stop_size() > kMaxStopStrings) {
    return Invalid("at most ", kMaxStopStrings, " stop strings, got ",
                   request.stop_size());
  }
  for (int i = 0; i < request.stop_size(); ++i) {
    const size_t n = request.stop(i).size();
    if (n == 0 || n > kMaxStopStringBytes) {
      return Invalid("stop[", i, "] must be 1 to ", kMaxStopStringBytes,
                     " bytes, got ", n);
    }
  }
  return absl::OkStatus();
}

absl::Status EngineRequestBuilder::CheckSizes(
    const v1::GenerateRequest& request) const {
  if (request.prompt().size() > max_prompt_bytes_) {
    return Invalid("the prompt is ", request.prompt().size(),
                   " bytes; at most ", max_prompt_bytes_, " are accepted");
  }
  if (request.prompt_token_ids_size() > kMaxPromptTokenIds) {
    return Invalid("at most ", kMaxPromptTokenIds, " prompt_token_ids, got ",
                   request.prompt_token_ids_size());
  }
  if (request.resume_token_ids_size() > kMaxPromptTokenIds) {
    return Invalid("at most ", kMaxPromptTokenIds, " resume_token_ids, got ",
                   request.resume_token_ids_size());
  }
  if (request.stop_token_ids_size() > kMaxStopTokenIds) {
    return Invalid("at most ", kMaxStopTokenIds, " stop_token_ids, got ",
                   request.stop_token_ids_size());
  }
  if (request.messages_size() > kMaxChatMessages) {
    return Invalid("at most ", kMaxChatMessages, " messages, got ",
                   request.messages_size());
  }
  RETURN_IF_ERROR(CheckTools(request));
  size_t message_bytes = 0;
  for (const v1::ChatMessage& m : request.messages()) {
    message_bytes += m.role().size() + m.content().size();
    for (const v1::ToolCall& c : m.tool_calls()) {
      message_bytes += c.name().size() + c.arguments().size();
    }
  }
  for (const v1::Tool& t : request.tools()) {
    message_bytes +=
        t.name().size() + t.description().size() + t.parameters().size();
  }
  if (message_bytes > max_prompt_bytes_) {
    return Invalid("the messages are ", message_bytes, " bytes; at most ",
                   max_prompt_bytes_, " are accepted");
  }
  return absl::OkStatus();
}

absl::Status EngineRequestBuilder::CheckTools(
    const v1::GenerateRequest& request) const {
  const std::string& choice = request.tool_choice();
  if (choice != "" && choice != "auto" && choice != "none" &&
      choice != "required") {
    return Invalid("tool_choice '", choice.substr(0, 64),
                   "' is not auto, none, required or a function");
  }
  const bool has_function = !request.tool_choice_function().empty();
  if (has_function && choice != "" && choice != "required") {
    return Invalid(
        "tool_choice_function needs tool_choice '' or required, "
        "not '",
        choice, "'");
  }
  if (request.tools_size() == 0) {
    if (choice == "required" || has_function) {
      return Invalid("tool_choice ",
                     has_function ? "names a function" : "'required'",
                     " but the request has no tools");
    }
    return absl::OkStatus();
  }
  if (request.tools_size() > kMaxTools) {
    return Invalid("at most ", kMaxTools, " tools, got ", request.tools_size());
  }
  if (request.messages_size() == 0) {
    return Invalid("tools need messages (a chat request)");
  }
  bool found = false;
  for (int i = 0; i < request.tools_size(); ++i) {
    RETURN_IF_ERROR(CheckTool(request, i));
    found |= request.tools(i).name() == request.tool_choice_function();
  }
  if (has_function && !found) {
    return Invalid("tool_choice names function '",
                   request.tool_choice_function().substr(0, 80),
                   "', which is not in tools");
  }
  return absl::OkStatus();
}

absl::Status EngineRequestBuilder::SetPrompt(const v1::GenerateRequest& request,
                                             GenerateRequest& req) const {
  if (request.messages_size() > 0) {
    ASSIGN_OR_RETURN(req.prompt, ChatPrompt(request));
  } else if (request.prompt_token_ids_size() > 0) {
    // Token ids take precedence over text.
    req.prompt.assign(request.prompt_token_ids().begin(),
                      request.prompt_token_ids().end());
    RETURN_IF_ERROR(CheckTokenIds(request.prompt_token_ids(),
                                  "prompt_token_ids", config_->vocab_size));
  } else {
    if (request.prompt().empty()) {
      return Invalid("one of prompt, prompt_token_ids or messages is required");
    }
    req.prompt = tokenizer_->EncodePrompt(request.prompt());
    if (req.prompt.empty()) return Invalid("the prompt encodes to no tokens");
  }
  // The last N tokens: the end of the prompt is what the completion follows.
  const size_t keep = static_cast<size_t>(request.truncate_prompt_tokens());
  if (keep > 0 && req.prompt.size() > keep) {
    req.prompt.erase(req.prompt.begin(), req.prompt.end() - keep);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> EngineRequestBuilder::ChatPrompt(
    const v1::GenerateRequest& request) const {
  if (!request.prompt().empty() || request.prompt_token_ids_size() > 0) {
    return Invalid("give one of prompt, prompt_token_ids and messages");
  }
  const absl::StatusOr<ChatTemplate>& chat_template = *chat_template_;
  if (!chat_template.ok()) {
    return Invalid("chat is not available for this model: ",
                   chat_template.status().message());
  }
  std::vector<ChatMessage> conversation;
  for (const v1::ChatMessage& m : request.messages()) {
    ChatMessage message{m.role(), m.content()};
    for (const v1::ToolCall& c : m.tool_calls()) {
      message.tool_calls.push_back(
          {.id = c.id(), .name = c.name(), .arguments = c.arguments()});
    }
    message.tool_call_id = m.tool_call_id();
    conversation.push_back(std::move(message));
  }
  // tool_choice "none" with a template that renders no tools: the tools
  // are left out (the model is not to call them anyway).
  std::vector<ChatTool> tools;
  if (request.tool_choice() != "none" ||
      chat_template->tool_format() != ToolCallFormat::kNone) {
    for (const v1::Tool& t : request.tools()) {
      tools.push_back({.name = t.name(),
                       .description = t.description(),
                       .parameters = t.parameters()});
    }
  }
  absl::StatusOr<std::string> text = chat_template->Render(
      conversation, tools,
      ChatTemplateVars{.reasoning_effort = request.reasoning_effort(),
                       .enable_thinking =
                           request.has_enable_thinking()
                               ? std::optional<bool>(request.enable_thinking())
                               : std::nullopt});
  if (!text.ok()) return Invalid(text.status().message());
  return tokenizer_->EncodePrompt(*text);
}

absl::Status EngineRequestBuilder::SetStopTokens(
    const v1::GenerateRequest& request, GenerateRequest& req) const {
  RETURN_IF_ERROR(CheckTokenIds(request.stop_token_ids(), "stop_token_ids",
                                config_->vocab_size));
  req.stop_token_ids.assign(request.stop_token_ids().begin(),
                            request.stop_token_ids().end());
  if (!request.ignore_eos()) {
    for (int32_t id : DefaultStopTokenIds(*config_, *tokenizer_)) {
      req.stop_token_ids.push_back(id);
    }
  }
  return absl::OkStatus();
}

absl::Status EngineRequestBuilder::SetResumed(
    const v1::GenerateRequest& request, GenerateRequest& req) const {
  // A resumed stream: the engine checks the tokens against max_tokens and
  // the stop tokens; here, the count and the vocabulary.
  if (request.resume_position() != request.resume_token_ids_size()) {
    return Invalid("resume_position (", request.resume_position(),
                   ") must equal the number of resume_token_ids (",
                   request.resume_token_ids_size(),
                   "): it is the draw index of the next token");
  }
  RETURN_IF_ERROR(CheckTokenIds(request.resume_token_ids(), "resume_token_ids",
                                config_->vocab_size));
  req.resumed.assign(request.resume_token_ids().begin(),
                     request.resume_token_ids().end());
  return absl::OkStatus();
}

absl::Status EngineRequestBuilder::AddConstraint(
    const v1::GenerateRequest& request, GenerateRequest& req) const {
  const v1::OutputConstraint& c = request.constraint();
  GrammarKind kind;
  std::string_view source;
  switch (c.kind_case()) {
    case v1::OutputConstraint::KIND_NOT_SET:
      return absl::OkStatus();
    case v1::OutputConstraint::kJsonObject:
      if (!c.json_object()) return absl::OkStatus();
      kind = GrammarKind::kJsonObject;
      break;
    case v1::OutputConstraint::kJsonSchema:
      kind = GrammarKind::kJsonSchema;
      source = c.json_schema();
      break;
    case v1::OutputConstraint::kGrammar:
      kind = GrammarKind::kGbnf;
      source = c.grammar();
      break;
    default:  // A newer client's kind.
      return Invalid("constraint: unknown kind ",
                     static_cast<int>(c.kind_case()));
  }
  if (req.stop_token_ids.empty()) {
    return Invalid(
        "constraint: a constrained output ends with an end-of-text token; "
        "give stop_token_ids or do not set ignore_eos");
  }
  if (grammars_ == nullptr) {
    return Invalid("constraint: this server has no tokenizer");
  }
  ASSIGN_OR_RETURN(std::shared_ptr<const CompiledGrammar> grammar,
                   grammars_->Get(kind, source));
  req.constraint =
      std::make_shared<GrammarConstraint>(grammar, req.stop_token_ids);
  return absl::OkStatus();
}

absl::Status EngineRequestBuilder::AddToolConstraint(
    const v1::GenerateRequest& request, GenerateRequest& req) const {
  const bool forced = !request.tool_choice_function().empty();
  if (request.tool_choice() != "required" && !forced) return absl::OkStatus();
  const ToolCallFormat format = OutputFormat(*chat_template_);
  if (format == ToolCallFormat::kHarmony) {
    return Invalid(
        "tool_choice required or a named function is not supported for the "
        "harmony format (gpt-oss) yet: no grammar constrains its channels; "
        "use tool_choice auto");
  }
  if (request.constraint().kind_case() != v1::OutputConstraint::KIND_NOT_SET) {
    return Invalid(
        "tool_choice required or a function constrains the output to tool "
        "calls: it cannot be combined with a constraint (response_format, "
        "grammar)");
  }
  if (req.stop_token_ids.empty()) {
    return Invalid(
        "tool_choice: a constrained output ends with an end-of-text token; "
        "give stop_token_ids or do not set ignore_eos");
  }
  if (grammars_ == nullptr) {
    return Invalid("tool_choice: this server has no tokenizer");
  }
  // The calls as the template renders an assistant's: Hermes (the model
  // writes its turn from the "\n" after the role on), or Llama 3.1's one
  // JSON call as the whole turn (its template renders one call a turn).
  using OrderedJson = nlohmann::ordered_json;
  const bool llama = format == ToolCallFormat::kLlamaJson;
  OrderedJson spec = {{"open", llama ? "" : "<tool_call>\n"},
                      {"close", llama ? "" : "\n</tool_call>"},
                      {"separator", "\n"},
                      {"multiple", !forced && !llama},
                      {"arguments_key", llama ? "parameters" : "arguments"},
                      {"tools", OrderedJson::array()}};
  for (int i = 0; i < request.tools_size(); ++i) {
    const v1::Tool& tool = request.tools(i);
    if (forced && tool.name() != request.tool_choice_function()) continue;
    OrderedJson params;  // null: any object.
    if (!tool.parameters().empty()) {
      params = OrderedJson::parse(tool.parameters(), nullptr,
                                  /*allow_exceptions=*/false);
    }
    spec["tools"].push_back(
        {{"index", i}, {"name", tool.name()}, {"parameters", params}});
  }
  ASSIGN_OR_RETURN(std::shared_ptr<const CompiledGrammar> grammar,
                   grammars_->Get(GrammarKind::kToolCalls, spec.dump()));
  req.constraint =
      std::make_shared<GrammarConstraint>(grammar, req.stop_token_ids);
  return absl::OkStatus();
}

absl::Status EngineRequestBuilder::AcceptResumed(GenerateRequest& req) {
  if (req.constraint == nullptr) return absl::OkStatus();
  for (size_t i = 0; i < req.resumed.size(); ++i) {
    if (absl::Status s = req.constraint->Accept(req.resumed[i]); !s.ok()) {
      return Invalid("resume_token_ids[", i,
                     "] breaks the constraint: ", s.message());
    }
  }
  return absl::OkStatus();
}

}  // namespace shardlm
