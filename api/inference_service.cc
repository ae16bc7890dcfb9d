#include <algorithm>
#include <cmath>
#include <deque>
#include <optional>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "api/api_key.h"
#include "api/inference_service.h"
#include "api/request_ranges.h"
#include "core/status.h"
#include "engine/stop_strings.h"
#include "grammar/json_schema.h"
#include "model/stop_tokens.h"
#include "model/tool_calls.h"
#include "nlohmann/json.hpp"
#include "step/kv_cache.h"

namespace shardlm {
namespace {

absl::Status Invalid(auto&&... parts) {
  return absl::InvalidArgumentError(absl::StrCat(parts...));
}

// Limits on GenerateRequest.stop (as OpenAI's 4, with room).
constexpr int kMaxStopStrings = 8;
constexpr size_t kMaxStopStringBytes = 256;
// Limits on the repeated fields of a request: far more than any real
// request, small enough that checking them costs nothing.
constexpr int kMaxStopTokenIds = 256;
constexpr int kMaxChatMessages = 256;
constexpr int kMaxPromptTokenIds = 1 << 18;
// OpenAI's limit on tools.
constexpr int kMaxTools = 128;
// Parallel sampling: at most this many sequences per request (`n`).
constexpr int kMaxN = 16;

// What tokenizing costs at most per byte of text: the token ids (up to 4
// bytes per byte, twice that while their vector grows) and the merge state
// of one 16 KiB cut (under 1 MiB); the pre-tokenizer keeps nothing.
// model/tokenizer_memory_test holds Encode to 8 bytes per byte + 1 MiB.
// And what a queued request holds besides its prompt's ids.
constexpr int64_t kTokenizeBytesPerByte = 10;
constexpr int64_t kQueuedRequestBytes = 4096;
// A parsed request beyond its wire bytes: the objects of at most 256
// messages, 8 stop strings and 256 unknown fields (~100 bytes each), and the
// 4-byte slots of up to 2^18 + 256 token ids (varints of 1 byte or more).
constexpr int64_t kParsedMessageBytes = 256 * 1024 + 4 * (1 << 18);

}  // namespace

size_t MaxGrpcRequestBytes(size_t max_prompt_bytes) {
  // Each field: its bytes plus at most 16 of tag and length.
  const size_t bytes =
      (max_prompt_bytes + 16) + (size_t{kMaxPromptTokenIds} * 5 + 16) +
      kMaxStopStrings * (kMaxStopStringBytes + 16) +
      (size_t{kMaxStopTokenIds} * 5 + 16) +
      size_t{kMaxLogitBias} * 16 +  // Entries: tag, length, key, value.
      (kMaxJsonSchemaBytes + 32) +  // constraint: a schema or grammar.
      1024;                         // Scalars, sampling.
  constexpr size_t kRound = 64 * 1024;
  return (bytes + kRound - 1) / kRound * kRound;
}

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

InferenceService::InferenceService(Engine* engine, const Tokenizer* tokenizer,
                                   std::string model_name,
                                   ServiceOptions options)
    : engine_(engine),
      tokenizer_(tokenizer),
      chat_template_(tokenizer != nullptr
                         ? ChatTemplate::ForModel(*tokenizer, absl::Now(),
                                                  options.chat_template)
                         : absl::FailedPreconditionError("no tokenizer")),
      model_name_(std::move(model_name)),
      options_(options),
      grammars_(tokenizer != nullptr ? std::make_unique<GrammarCache>(tokenizer)
                                     : nullptr) {}

absl::Status InferenceService::AddConstraint(const v1::GenerateRequest& request,
                                             GenerateRequest& req) const {
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

absl::Status InferenceService::CheckTools(
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
    const v1::Tool& tool = request.tools(i);
    const std::string& name = tool.name();
    const bool valid = !name.empty() && name.size() <= 64 &&
                       std::all_of(name.begin(), name.end(), [](char c) {
                         return (c >= 'a' && c <= 'z') ||
                                (c >= 'A' && c <= 'Z') ||
                                (c >= '0' && c <= '9') || c == '_' || c == '-';
                       });
    if (!valid) {
      return Invalid("tools[", i,
                     "].function.name must be 1 to 64 of a-z, A-Z, 0-9, _ "
                     "and -, got '",
                     name.substr(0, 80), "'");
    }
    for (int j = 0; j < i; ++j) {
      if (request.tools(j).name() == name) {
        return Invalid("tools[", i, "].function.name '", name,
                       "' is also tools[", j, "]'s");
      }
    }
    found |= name == request.tool_choice_function();
    if (tool.parameters().size() > kMaxJsonSchemaBytes) {
      return Invalid("tools[", i, "].function.parameters is ",
                     tool.parameters().size(), " bytes; at most ",
                     kMaxJsonSchemaBytes, " are accepted");
    }
    if (!tool.parameters().empty()) {
      const nlohmann::json p = nlohmann::json::parse(
          tool.parameters(), nullptr, /*allow_exceptions=*/false);
      if (!p.is_object()) {
        return Invalid("tools[", i,
                       "].function.parameters must be a JSON Schema object");
      }
    }
  }
  if (has_function && !found) {
    return Invalid("tool_choice names function '",
                   request.tool_choice_function().substr(0, 80),
                   "', which is not in tools");
  }
  return absl::OkStatus();
}

std::vector<std::string> RequestedToolCallNames(
    const v1::GenerateRequest& request) {
  std::vector<std::string> names;
  if (request.tools_size() == 0 || request.tool_choice() == "none") {
    return names;
  }
  for (const v1::Tool& tool : request.tools()) {
    if (request.tool_choice_function().empty() ||
        tool.name() == request.tool_choice_function()) {
      names.push_back(tool.name());
    }
  }
  return names;
}

ToolCallFormat InferenceService::tool_call_format() const {
  if (!chat_template_.ok()) return ToolCallFormat::kNone;
  return chat_template_->output_format();
}

ReasoningFormat InferenceService::reasoning_format() const {
  return chat_template_.ok() ? chat_template_->reasoning_format()
                             : ReasoningFormat::kNone;
}

std::vector<std::string> InferenceService::ToolCallNames(
    const v1::GenerateRequest& request) const {
  if (!chat_template_.ok() ||
      chat_template_->tool_format() == ToolCallFormat::kNone) {
    return {};
  }
  return RequestedToolCallNames(request);
}

absl::Status InferenceService::AddToolConstraint(
    const v1::GenerateRequest& request, GenerateRequest& req) const {
  const bool forced = !request.tool_choice_function().empty();
  if (request.tool_choice() != "required" && !forced) return absl::OkStatus();
  if (tool_call_format() == ToolCallFormat::kHarmony) {
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
  const bool llama = tool_call_format() == ToolCallFormat::kLlamaJson;
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

absl::StatusOr<GenerateRequest> InferenceService::ToEngineRequest(
    const v1::GenerateRequest& request) const {
  const ModelConfig& config = engine_->config();
  const int64_t vocab = config.vocab_size;
  GenerateRequest req;

  req.max_tokens = request.max_tokens() == 0 ? options_.default_max_tokens
                                             : request.max_tokens();
  if (!CheckMaxTokens(req.max_tokens, config.context_length).ok()) {
    return CheckMaxTokens(request.max_tokens(), config.context_length);
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
  RETURN_IF_ERROR(CheckSampling(req.sampling, vocab));
  RETURN_IF_ERROR(CheckLogprobs(request.logprobs()));
  req.logprobs = request.logprobs();
  RETURN_IF_ERROR(CheckPromptLogprobs(request.prompt_logprobs()));
  req.prompt_logprobs = request.prompt_logprobs();
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
  RETURN_IF_ERROR(CheckTruncatePromptTokens(request.truncate_prompt_tokens()));

  // Sizes first: nothing below may cost more than the request's bytes.
  if (request.prompt().size() > options_.max_prompt_bytes) {
    return Invalid("the prompt is ", request.prompt().size(),
                   " bytes; at most ", options_.max_prompt_bytes,
                   " are accepted");
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
  if (message_bytes > options_.max_prompt_bytes) {
    return Invalid("the messages are ", message_bytes, " bytes; at most ",
                   options_.max_prompt_bytes, " are accepted");
  }
  if (request.messages_size() > 0) {
    if (!request.prompt().empty() || request.prompt_token_ids_size() > 0) {
      return Invalid("give one of prompt, prompt_token_ids and messages");
    }
    if (!chat_template_.ok()) {
      return Invalid("chat is not available for this model: ",
                     chat_template_.status().message());
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
        chat_template_->tool_format() != ToolCallFormat::kNone) {
      for (const v1::Tool& t : request.tools()) {
        tools.push_back({.name = t.name(),
                         .description = t.description(),
                         .parameters = t.parameters()});
      }
    }
    absl::StatusOr<std::string> text = chat_template_->Render(
        conversation, tools,
        ChatTemplateVars{.reasoning_effort = request.reasoning_effort(),
                         .enable_thinking = request.has_enable_thinking()
                                                ? std::optional<bool>(
                                                      request.enable_thinking())
                                                : std::nullopt});
    if (!text.ok()) return Invalid(text.status().message());
    req.prompt = tokenizer_->EncodePrompt(*text);
  } else if (request.prompt_token_ids_size() > 0) {
    // Token ids take precedence over text.
    req.prompt.assign(request.prompt_token_ids().begin(),
                      request.prompt_token_ids().end());
    for (int i = 0; i < request.prompt_token_ids_size(); ++i) {
      const int32_t t = request.prompt_token_ids(i);
      if (t < 0 || t >= vocab) {
        return Invalid("prompt_token_ids[", i, "] = ", t,
                       " is outside the vocabulary of ", vocab);
      }
    }
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

  for (int i = 0; i < request.stop_token_ids_size(); ++i) {
    const int32_t t = request.stop_token_ids(i);
    if (t < 0 || t >= vocab) {
      return Invalid("stop_token_ids[", i, "] = ", t,
                     " is outside the vocabulary of ", vocab);
    }
    req.stop_token_ids.push_back(t);
  }
  if (!request.ignore_eos()) {
    for (int32_t id : DefaultStopTokenIds(config, *tokenizer_)) {
      req.stop_token_ids.push_back(id);
    }
  }

  // A resumed stream: the engine checks the tokens against max_tokens and
  // the stop tokens; here, the count and the vocabulary.
  if (request.resume_position() != request.resume_token_ids_size()) {
    return Invalid("resume_position (", request.resume_position(),
                   ") must equal the number of resume_token_ids (",
                   request.resume_token_ids_size(),
                   "): it is the draw index of the next token");
  }
  for (int i = 0; i < request.resume_token_ids_size(); ++i) {
    const int32_t t = request.resume_token_ids(i);
    if (t < 0 || t >= vocab) {
      return Invalid("resume_token_ids[", i, "] = ", t,
                     " is outside the vocabulary of ", vocab);
    }
  }
  req.resumed.assign(request.resume_token_ids().begin(),
                     request.resume_token_ids().end());
  RETURN_IF_ERROR(AddConstraint(request, req));
  RETURN_IF_ERROR(AddToolConstraint(request, req));
  // A resumed constrained stream: its grammar state follows the tokens
  // already sent, which must be a prefix of a sentence.
  if (req.constraint != nullptr) {
    for (size_t i = 0; i < req.resumed.size(); ++i) {
      if (absl::Status s = req.constraint->Accept(req.resumed[i]); !s.ok()) {
        return Invalid("resume_token_ids[", i,
                       "] breaks the constraint: ", s.message());
      }
    }
  }
  return req;
}

// The n sequences of one request, submitted to the engine in one intake
// (Engine::SubmitGroup) once every member is ready or has left (refused
// before submitting): each member's RunOne calls Submit, which waits for
// the others, or Leave.
class SequenceGroup {
 public:
  SequenceGroup(Engine* engine, int members)
      : engine_(engine), expected_(members) {}

  absl::StatusOr<RequestId> Submit(GenerateRequest request,
                                   RequestCallbacks callbacks) {
    absl::MutexLock lock(&mu_);
    const size_t at = members_.size();
    members_.push_back({std::move(request), std::move(callbacks)});
    SubmitIfComplete();
    mu_.Await(absl::Condition(
        +[](bool* submitted) { return *submitted; }, &submitted_));
    return ids_[at];
  }

  void Leave() {
    absl::MutexLock lock(&mu_);
    ++left_;
    SubmitIfComplete();
  }

 private:
  void SubmitIfComplete() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (static_cast<int>(members_.size()) + left_ < expected_) return;
    ids_ = engine_->SubmitGroup(std::move(members_));
    submitted_ = true;
  }

  Engine* const engine_;
  const int expected_;
  absl::Mutex mu_;
  std::vector<Scheduler::GroupMember> members_ ABSL_GUARDED_BY(mu_);
  int left_ ABSL_GUARDED_BY(mu_) = 0;
  bool submitted_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<absl::StatusOr<RequestId>> ids_ ABSL_GUARDED_BY(mu_);
};

namespace {

// One request's stream. The scheduler's loop thread turns each token into
// its response (text, stop strings, log-probabilities: it must know at once
// whether a stop string ended the request); the RPC's thread writes them.
// Shared: the loop may still hold its callbacks when the RPC returns.
struct Stream {
  Stream(const Tokenizer* tokenizer, std::vector<std::string> stop_strings)
      : detok(tokenizer), stops(std::move(stop_strings)) {}

  absl::Mutex mu;
  std::deque<v1::GenerateResponse> responses ABSL_GUARDED_BY(mu);
  std::optional<absl::StatusOr<GenerateResult>> done ABSL_GUARDED_BY(mu);
  // Used by on_token, then (once done is set) by the RPC's thread.
  StreamingDetokenizer detok;
  StopStringFilter stops;
  int32_t generated = 0;
  // Prompt logprobs, from on_prompt_logprobs until the first response.
  std::vector<v1::TokenLogprobs> prompt_logprobs;
};

// The text of one token alone, as valid UTF-8.
std::string TokenText(const Tokenizer& tokenizer, int32_t id) {
  StreamingDetokenizer d(&tokenizer);
  std::string text = d.Push(id);
  return text + d.Finish();
}

void AddLogprobs(const Tokenizer& tokenizer, int32_t id,
                 const TokenLogprobs& lp, v1::GenerateResponse& response) {
  v1::TokenLogprobs& out = *response.add_logprobs();
  const auto set = [&](v1::TokenLogprob& t, int32_t token, float logprob) {
    t.set_token_id(token);
    t.set_text(TokenText(tokenizer, token));
    t.set_logprob(logprob);
  };
  set(*out.mutable_token(), id, lp.sampled);
  for (const TokenLogprob& t : lp.top) set(*out.add_top(), t.token, t.logprob);
}

absl::Time ToAbslDeadline(std::chrono::system_clock::time_point t) {
  // gRPC reports "no deadline" as the far future.
  if (t >= std::chrono::system_clock::now() + std::chrono::hours(24 * 365)) {
    return absl::InfiniteFuture();
  }
  return absl::FromChrono(t);
}

}  // namespace

grpc::Status InferenceService::Generate(
    grpc::ServerContext* context, const v1::GenerateRequest* request,
    grpc::ServerWriter<v1::GenerateResponse>* writer) {
  if (absl::Status s = CheckApiKey(*context); !s.ok()) return ToGrpcStatus(s);
  // The message as received and as parsed, held while the call runs.
  absl::StatusOr<MemoryShare> share = TakeMemory(
      static_cast<int64_t>(request->ByteSizeLong() + request->SpaceUsedLong()),
      "the gRPC message");
  if (!share.ok()) return ToGrpcStatus(share.status());
  return ToGrpcStatus(Run(
      *request, ToAbslDeadline(context->deadline()),
      [context] { return context->IsCancelled(); },
      [writer](const v1::GenerateResponse& r) { return writer->Write(r); }));
}

absl::Status InferenceService::Run(
    const v1::GenerateRequest& request, absl::Time deadline,
    const std::function<bool()>& cancelled,
    const std::function<bool(const v1::GenerateResponse&)>& write,
    RequestApi api) {
  const int n = request.n() == 0 ? 1 : request.n();
  if (n < 1 || n > kMaxN) {
    return Invalid("n must be 1 to ", kMaxN, ", got ", request.n());
  }
  if (n == 1) return RunOne(request, deadline, cancelled, write, api);
  if (request.resume_token_ids_size() > 0) {
    return Invalid("resume_token_ids need n = 1 (a stream is one sequence)");
  }
  absl::Mutex write_mu;
  bool writing = true;  // False once a write failed: the client is gone.
  // With prefix caching, a hidden one-token request computes the prompt
  // first: the n sequences then find its full blocks cached and compute
  // only the rest (one prefill, not n). Its cached tokens are the
  // request's (what the n found cached, it computed), and it scores the
  // prompt when prompt logprobs are asked for (then even without prefix
  // caching): they go out with the first response, whichever choice's.
  const bool prefill_first =
      engine_->blocks().prefix_caching() || request.prompt_logprobs() > 0;
  int32_t cached_tokens = -1;
  std::vector<v1::TokenLogprobs> prompt_logprobs;
  if (prefill_first) {
    v1::GenerateRequest prefill = request;
    prefill.set_n(1);
    prefill.set_max_tokens(1);
    prefill.set_min_tokens(0);
    prefill.set_logprobs(0);  // The constraint stays: a bad one fails here.
    RETURN_IF_ERROR(RunOne(
        prefill, deadline, cancelled,
        [&](const v1::GenerateResponse& r) {
          if (r.has_usage()) cached_tokens = r.usage().cached_tokens();
          prompt_logprobs.insert(prompt_logprobs.end(),
                                 r.prompt_logprobs().begin(),
                                 r.prompt_logprobs().end());
          return true;
        },
        api));
  }
  bool first = true;
  const auto indexed = [&](int index, const v1::GenerateResponse& r) {
    absl::MutexLock lock(&write_mu);
    if (!writing) return false;
    v1::GenerateResponse tagged = r;
    tagged.set_index(index);
    if (tagged.has_usage() && cached_tokens >= 0) {
      tagged.mutable_usage()->set_cached_tokens(cached_tokens);
    }
    if (first) {
      first = false;
      for (v1::TokenLogprobs& lp : prompt_logprobs) {
        *tagged.add_prompt_logprobs() = std::move(lp);
      }
    }
    writing = write(tagged);
    return writing;
  };
  // The n sequences enter the scheduler together (SequenceGroup): planned
  // from the same state in the same steps, so a seeded request's n texts
  // do not depend on when each thread got there. Sequence i samples with
  // seed + i.
  SequenceGroup group(engine_, n);
  std::vector<absl::Status> statuses(n);
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      v1::GenerateRequest child = request;
      child.set_prompt_logprobs(0);  // The prefill request scored.
      child.mutable_sampling()->set_seed(request.sampling().seed() +
                                         static_cast<uint64_t>(i));
      statuses[i] = RunOne(
          child, deadline, cancelled,
          [&, i](const v1::GenerateResponse& r) { return indexed(i, r); }, api,
          &group);
    });
  }
  for (std::thread& t : threads) t.join();
  for (const absl::Status& s : statuses) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status InferenceService::RunOne(
    const v1::GenerateRequest& request_proto, absl::Time deadline,
    const std::function<bool()>& cancelled,
    const std::function<bool(const v1::GenerateResponse&)>& write,
    RequestApi api, SequenceGroup* group) {
  // Counted before the check, so that Drain never misses one that passed.
  ++in_flight_;
  struct Leave {
    std::atomic<int64_t>& n;
    ~Leave() { --n; }
  } leave{in_flight_};
  // A member of a group that returns before submitting leaves it, so that
  // the others are not kept waiting.
  struct LeaveGroup {
    SequenceGroup* group;
    ~LeaveGroup() {
      if (group != nullptr) group->Leave();
    }
  } leave_group{group};
  if (draining_) {
    return absl::UnavailableError(
        "the server is draining (shutting down): it finishes the requests "
        "it has and takes no new ones");
  }
  const v1::GenerateRequest* request = &request_proto;
  // Tokenizing is paid for before it starts; what is left of the share then
  // holds the queued request's prompt until the request ends.
  int64_t text_bytes = static_cast<int64_t>(
      std::min(request->prompt().size(), options_.max_prompt_bytes));
  for (const v1::ChatMessage& m : request->messages()) {
    text_bytes += static_cast<int64_t>(m.role().size() + m.content().size());
  }
  text_bytes = std::min<int64_t>(
      text_bytes, static_cast<int64_t>(options_.max_prompt_bytes) * 2);
  absl::StatusOr<MemoryShare> share = TakeMemory(
      text_bytes * kTokenizeBytesPerByte +
          (std::min(request->prompt_token_ids_size(), kMaxPromptTokenIds) +
           std::min(request->resume_token_ids_size(), kMaxPromptTokenIds)) *
              int64_t{sizeof(int32_t)} +
          kQueuedRequestBytes,
      "tokenizing the prompt");
  if (!share.ok()) return share.status();
  absl::StatusOr<GenerateRequest> req = ToEngineRequest(*request);
  if (!req.ok()) return req.status();
  share->ShrinkTo(
      static_cast<int64_t>((req->prompt.size() + req->resumed.size()) *
                           sizeof(int32_t)) +
      kQueuedRequestBytes);
  req->api = api;
  // A cluster with a lost (or not yet joined) rank: UNAVAILABLE naming it.
  if (absl::Status h = engine_->executor().Health(); !h.ok()) return h;
  if (request->priority() > options_.max_client_priority) {
    return absl::InvalidArgumentError(absl::StrCat(
        "priority ", request->priority(), " is above this server's limit ",
        options_.max_client_priority, " (--max-client-priority)"));
  }
  req->priority = request->priority();
  req->deadline = deadline;
  const int32_t max_tokens = req->max_tokens;
  const int32_t prompt_tokens = static_cast<int32_t>(req->prompt.size());
  const std::vector<int32_t> stop_ids = req->stop_token_ids;
  const auto finish = [prompt_tokens](v1::GenerateResponse& r,
                                      const char* reason, int32_t generated) {
    r.set_finish_reason(reason);
    r.mutable_usage()->set_prompt_tokens(prompt_tokens);
    r.mutable_usage()->set_completion_tokens(generated);
  };

  // The scheduler batches this request with every other one in flight.
  auto stream = std::make_shared<Stream>(
      tokenizer_,
      std::vector<std::string>(request->stop().begin(), request->stop().end()));
  // A resumed stream: whoever generated these tokens sent their text, up
  // to what the stop strings held back, which is a function of the text:
  // the same pass over them leaves this stream where that one was.
  for (int32_t id : req->resumed)
    (void)stream->stops.Push(stream->detok.Push(id));
  if (stream->stops.stopped()) {
    return absl::InvalidArgumentError(
        "resume_token_ids contain a stop string: the stream had ended");
  }
  stream->generated = static_cast<int32_t>(req->resumed.size());
  const Tokenizer* tokenizer = tokenizer_;
  RequestCallbacks callbacks{
      .on_token =
          [stream, tokenizer, stop_ids, max_tokens, finish](
              int32_t id, const TokenLogprobs* logprobs) {
            Stream& s = *stream;  // Only this thread uses it until done.
            const int32_t generated = ++s.generated;
            v1::GenerateResponse response;
            for (v1::TokenLogprobs& lp : s.prompt_logprobs) {
              *response.add_prompt_logprobs() = std::move(lp);
            }
            s.prompt_logprobs.clear();
            response.add_token_ids(id);
            if (logprobs != nullptr) {
              AddLogprobs(*tokenizer, id, *logprobs, response);
            }
            // Stop tokens are reported by id but not printed.
            const bool stop_token = std::find(stop_ids.begin(), stop_ids.end(),
                                              id) != stop_ids.end();
            std::string text = stop_token ? "" : s.stops.Push(s.detok.Push(id));
            // The scheduler ends a request at a stop token or max_tokens,
            // and at a stop string when told below; the last token's
            // response carries the finish (when this is ever wrong, a
            // separate final response follows in Generate).
            if (!s.stops.stopped() && (stop_token || generated >= max_tokens)) {
              text += s.stops.Push(s.detok.Finish());
              text += s.stops.Finish();
            }
            const bool stop = stop_token || s.stops.stopped();
            response.set_text(std::move(text));
            if (stop || generated >= max_tokens) {
              finish(response, stop ? "stop" : "length", generated);
              response.set_stop_sequence(s.stops.matched());
            }
            absl::MutexLock lock(&s.mu);  // The RPC's Await sees it.
            s.responses.push_back(std::move(response));
            return s.stops.stopped() ? TokenAction::kStop
                                     : TokenAction::kContinue;
          },
      .on_prompt_logprobs =
          [stream, tokenizer,
           prompt =
               req->prompt_logprobs > 0 ? req->prompt : std::vector<int32_t>{}](
              const std::vector<TokenLogprobs>& logprobs) {
            // The first prompt token has no logprob; the others' follow.
            std::vector<v1::TokenLogprobs>& out = stream->prompt_logprobs;
            v1::TokenLogprob& first = *out.emplace_back().mutable_token();
            first.set_token_id(prompt[0]);
            first.set_text(TokenText(*tokenizer, prompt[0]));
            for (size_t i = 0; i < logprobs.size() && i + 1 < prompt.size();
                 ++i) {
              v1::GenerateResponse one;
              AddLogprobs(*tokenizer, prompt[i + 1], logprobs[i], one);
              out.push_back(std::move(*one.mutable_logprobs(0)));
            }
          },
      .on_done =
          [stream](absl::StatusOr<GenerateResult> result) {
            absl::MutexLock lock(&stream->mu);
            stream->done = std::move(result);
          }};
  leave_group.group = nullptr;
  absl::StatusOr<RequestId> id =
      group != nullptr ? group->Submit(*std::move(req), std::move(callbacks))
                       : engine_->Submit(*std::move(req), std::move(callbacks));
  if (!id.ok()) return id.status();

  // Tool calls: the text streams as the model wrote it; the last response
  // carries the calls parsed from it.
  const std::vector<std::string> tool_names = ToolCallNames(*request);
  std::optional<ToolCallStream> tool_calls;
  std::vector<ChatToolCall> calls;
  if (!tool_names.empty()) {
    tool_calls.emplace(tool_names, tool_call_format(),
                       RequestReasoningFormat(
                           reasoning_format(),
                           request->has_enable_thinking()
                               ? std::optional<bool>(request->enable_thinking())
                               : std::nullopt));
  }
  const std::string call_id_prefix = absl::StrCat(
      "call_", absl::Hex(absl::ToUnixNanos(absl::Now()) ^ *id), "_");
  const auto write_parsed = [&](const v1::GenerateResponse& response) {
    if (!tool_calls) return write(response);
    for (ChatToolCall& c : tool_calls->Push(response.text()).calls) {
      calls.push_back(std::move(c));
    }
    if (response.finish_reason().empty()) return write(response);
    for (ChatToolCall& c : tool_calls->Finish().calls) {
      calls.push_back(std::move(c));
    }
    v1::GenerateResponse last = response;
    for (size_t i = 0; i < calls.size(); ++i) {
      v1::ToolCall& c = *last.add_tool_calls();
      c.set_id(absl::StrCat(call_id_prefix, i));
      c.set_name(calls[i].name);
      c.set_arguments(calls[i].arguments);
    }
    if (!calls.empty() && last.finish_reason() == "stop") {
      last.set_finish_reason("tool_calls");
    }
    return write(last);
  };

  bool sent_final = false;
  std::optional<v1::GenerateResponse> final_response;
  bool client_gone = false;
  absl::StatusOr<GenerateResult> result;
  Stream* const st = stream.get();
  const auto ready = [st]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(st->mu) {
    return !st->responses.empty() || st->done.has_value();
  };
  st->mu.Lock();
  while (true) {
    // Woken by the loop's callbacks; every 50 ms anyway, to see a cancel.
    st->mu.AwaitWithTimeout(absl::Condition(&ready), absl::Milliseconds(50));
    std::deque<v1::GenerateResponse> responses;
    responses.swap(st->responses);
    const bool finished = st->done.has_value();
    if (finished) result = std::move(*st->done);
    st->mu.Unlock();
    if (!client_gone && cancelled()) {
      client_gone = true;
      engine_->Cancel(*id);
    }
    for (v1::GenerateResponse& response : responses) {
      if (client_gone) break;
      if (!response.finish_reason().empty()) {
        // Its usage takes the cached prompt tokens from the result, which
        // on_done brings right after the last token.
        sent_final = true;
        final_response = std::move(response);
        break;
      }
      if (!write_parsed(response)) {
        client_gone = true;
        engine_->Cancel(*id);
      }
    }
    if (finished && final_response && !client_gone) {
      if (result.ok()) {
        final_response->mutable_usage()->set_cached_tokens(
            static_cast<int32_t>(result->cached_prompt_tokens));
      }
      if (!write_parsed(*final_response)) client_gone = true;
    }
    // After a cancel, wait for the end too: its blocks are free by then.
    if (finished) break;
    st->mu.Lock();
  }

  if (!result.ok()) return result.status();
  if (client_gone || result->finish_reason == FinishReason::kCancelled) {
    return absl::CancelledError("the client cancelled the request");
  }
  if (!sent_final) {
    // on_done has run: the loop no longer touches the stream.
    Stream& s = *stream;
    v1::GenerateResponse response;
    std::string text = s.stops.Push(s.detok.Finish());
    response.set_text(text + s.stops.Finish());
    finish(response, FinishReasonName(result->finish_reason), s.generated);
    response.set_stop_sequence(s.stops.matched());
    response.mutable_usage()->set_cached_tokens(
        static_cast<int32_t>(result->cached_prompt_tokens));
    write_parsed(response);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> InferenceService::ReadWire(
    const grpc::ByteBuffer& request,
    absl::Status (*scan)(absl::string_view, const GrpcScanLimits&),
    MemoryShare* share) {
  // The bytes as gRPC holds them, the flat copy below, and the parsed
  // message: the scan bounds its counts, so it is at most about its bytes
  // plus a small overhead per element.
  const int64_t bytes = static_cast<int64_t>(request.Length());
  ASSIGN_OR_RETURN(
      *share, TakeMemory(3 * bytes + kParsedMessageBytes, "the gRPC message"));
  std::vector<grpc::Slice> slices;
  if (!request.Dump(&slices).ok()) {
    return absl::InternalError("the request's bytes could not be read");
  }
  std::string flat;
  flat.reserve(static_cast<size_t>(bytes));
  for (const grpc::Slice& slice : slices) {
    flat.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  if (absl::Status s = scan(flat, GrpcScanLimits{}); !s.ok()) {
    if (absl::StrContains(s.message(), "is not valid UTF-8")) ++invalid_utf8_;
    return s;
  }
  return flat;
}

grpc::Status InferenceService::GenerateWire(
    grpc::ServerContext* context, const grpc::ByteBuffer& request,
    grpc::ServerWriter<v1::GenerateResponse>* writer) {
  if (absl::Status s = CheckApiKey(*context); !s.ok()) return ToGrpcStatus(s);
  MemoryShare share;
  absl::StatusOr<std::string> wire =
      ReadWire(request, &ScanGenerateRequest, &share);
  if (!wire.ok()) return ToGrpcStatus(wire.status());
  v1::GenerateRequest parsed;
  if (!parsed.ParseFromString(*wire)) {
    return grpc::Status(
        grpc::StatusCode::INTERNAL,
        "the request is not a valid shardlm.v1.GenerateRequest");
  }
  *wire = std::string();
  return ToGrpcStatus(Run(
      parsed, ToAbslDeadline(context->deadline()),
      [context] { return context->IsCancelled(); },
      [writer](const v1::GenerateResponse& r) { return writer->Write(r); }));
}

grpc::Status InferenceService::TokenizeWire(grpc::ServerContext* context,
                                            const grpc::ByteBuffer& request,
                                            v1::TokenizeResponse* response) {
  if (absl::Status s = CheckApiKey(*context); !s.ok()) return ToGrpcStatus(s);
  MemoryShare share;
  absl::StatusOr<std::string> wire =
      ReadWire(request, &ScanTokenizeRequest, &share);
  if (!wire.ok()) return ToGrpcStatus(wire.status());
  v1::TokenizeRequest parsed;
  if (!parsed.ParseFromString(*wire)) {
    return grpc::Status(
        grpc::StatusCode::INTERNAL,
        "the request is not a valid shardlm.v1.TokenizeRequest");
  }
  *wire = std::string();
  return Tokenize(context, &parsed, response);
}

absl::StatusOr<MemoryShare> InferenceService::TakeMemory(
    int64_t bytes, absl::string_view what) const {
  if (options_.memory_budget == nullptr) return MemoryShare();
  return options_.memory_budget->Take(bytes, what);
}

absl::Status InferenceService::CheckApiKey(
    const grpc::ServerContext& context) const {
  if (options_.api_key.empty()) return absl::OkStatus();
  const auto& metadata = context.client_metadata();
  const auto it = metadata.find("authorization");
  if (it == metadata.end() ||
      !ApiKeyMatches(absl::string_view(it->second.data(), it->second.size()),
                     options_.api_key)) {
    return absl::UnauthenticatedError(
        "missing or wrong API key (metadata authorization: Bearer <key>; "
        "shardlm generate reads SHARDLM_API_KEY)");
  }
  return absl::OkStatus();
}

grpc::Status InferenceService::Tokenize(grpc::ServerContext* context,
                                        const v1::TokenizeRequest* request,
                                        v1::TokenizeResponse* response) {
  if (absl::Status s = CheckApiKey(*context); !s.ok()) return ToGrpcStatus(s);
  if (request->text().size() > options_.max_prompt_bytes) {
    return ToGrpcStatus(Invalid("the text is ", request->text().size(),
                                " bytes; at most ", options_.max_prompt_bytes,
                                " are accepted"));
  }
  absl::StatusOr<MemoryShare> share = TakeMemory(
      static_cast<int64_t>(request->ByteSizeLong() + request->SpaceUsedLong()) +
          static_cast<int64_t>(request->text().size()) * kTokenizeBytesPerByte,
      "tokenizing the text");
  if (!share.ok()) return ToGrpcStatus(share.status());
  for (int32_t id : tokenizer_->Encode(request->text())) {
    response->add_token_ids(id);
  }
  return grpc::Status::OK;
}

grpc::Status InferenceService::GetModelInfo(
    grpc::ServerContext* context, const v1::GetModelInfoRequest* request,
    v1::ModelInfo* response) {
  if (absl::Status s = CheckApiKey(*context); !s.ok()) return ToGrpcStatus(s);
  // Fixed after construction: safe to read while a Generate runs.
  const ModelConfig& config = engine_->config();
  response->set_name(model_name_);
  response->set_vocab_size(static_cast<int32_t>(config.vocab_size));
  response->set_context_length(static_cast<int32_t>(config.context_length));
  response->set_tp(options_.tp);
  response->set_pp(options_.pp);
  response->set_cp(options_.cp);
  // Per worker: the block manager's ids are the CP group's.
  const int cp = engine_->blocks().interleave();
  response->set_kv_blocks(engine_->blocks().num_blocks() / cp);
  response->set_block_size(engine_->blocks().block_size());
  response->set_host_kv_blocks(engine_->blocks().num_host_blocks() / cp);
  const DType kv_dtype = engine_->executor().kv_cache_dtype();
  response->set_kv_cache_dtype(KvCacheDTypeName(kv_dtype));
  response->set_kv_bytes_per_token(
      KvBytesPerToken(engine_->config(), kv_dtype));
  response->set_prefix_caching(engine_->blocks().prefix_caching());
  response->set_tool_call_format(ToolCallFormatName(tool_call_format()));
  response->set_reasoning_format(ReasoningFormatName(reasoning_format()));
  return grpc::Status::OK;
}

}  // namespace shardlm
