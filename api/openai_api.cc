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
#include "api/completion_writer.h"
#include "api/messages_api.h"
#include "api/openai_protocol.h"
#include "api/openai_request_scan.h"
#include "api/request_ranges.h"
#include "api/responses_api.h"
#include "core/status.h"
#include "engine/serving_metrics.h"
#include "grammar/json_schema.h"
#include "model/tool_calls.h"
#include "nlohmann/json.hpp"
#include "step/kv_cache.h"
#include "step/step.h"

namespace shardlm {
namespace {

using openai_wire::Dump;
using openai_wire::Echo;
using openai_wire::ErrorJson;
using openai_wire::Get;
using openai_wire::Invalid;
using openai_wire::Json;
using openai_wire::kDomBytesPerValue;
using openai_wire::ResponseShape;
using openai_wire::ToProto;

// A completions request as the service takes it, and what its answer shows.
struct CompletionRequest {
  v1::GenerateRequest proto;
  ResponseShape shape;
  bool stream = false;
  // OpenAI's stream_options.include_usage: one more chunk before [DONE],
  // with no choices and the request's usage.
  bool include_usage = false;
};

absl::StatusOr<CompletionRequest> ParseCompletion(const std::string& raw_body,
                                                  bool chat,
                                                  const std::string& model_name,
                                                  int64_t context_length) {
  const Json body = Json::parse(raw_body, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded() || !body.is_object()) {
    return Invalid("the body is not a JSON object");
  }
  CompletionRequest request;
  ASSIGN_OR_RETURN(request.proto, ToProto(body, raw_body, chat, model_name,
                                          context_length, &request.shape));
  RETURN_IF_ERROR(Get(body, "stream", &request.stream));
  // As vLLM: prompt_logprobs are in the whole response only.
  if (request.stream && request.shape.prompt_top_n >= 0) {
    return Invalid("'prompt_logprobs' is not supported with 'stream'");
  }
  if (body.contains("stream_options") && !body["stream_options"].is_null()) {
    const Json& options = body["stream_options"];
    if (!request.stream) {
      return Invalid("'stream_options' needs 'stream': true");
    }
    if (!options.is_object()) {
      return Invalid("'stream_options' must be an object");
    }
    if (!Get(options, "include_usage", &request.include_usage).ok()) {
      return Invalid("'stream_options.include_usage' must be a boolean");
    }
  }
  return request;
}

// What computed the answer: version, backend and precision (OpenAI's
// field for the configuration that produced it). Without an engine (an
// API over a run function alone, in tests): the version.
std::string Fingerprint(const Engine* engine) {
  return engine == nullptr ? absl::StrCat("shardlm-", ShardlmVersion())
                           : absl::StrCat("shardlm-", ShardlmVersion(), "-",
                                          engine->executor().backend(), "-",
                                          PrecisionName(engine->precision()));
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
    const Json body = {
        {"object", "list"},
        {"data",
         {{{"id", options_.model_name},
           {"object", "model"},
           {"created", 0},
           {"owned_by", "shardlm"},
           {"max_model_len", context_length_},
           {"precision", engine_ == nullptr
                             ? "exact"
                             : PrecisionName(engine_->precision())}}}}};
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
    SendError(res, s, ErrorJson(s));
  };
  // The DOM, and the request built from it, are paid for before they exist.
  absl::StatusOr<MemoryShare> parse_share = ChargeBody(req, 1);
  if (!parse_share.ok()) return fail(parse_share.status());
  absl::StatusOr<CompletionRequest> request =
      ParseCompletion(req.body, chat, options_.model_name, context_length_);
  if (!request.ok()) return fail(request.status());
  const bool stream = request->stream;

  CompletionWriter::Head head{
      .id = absl::StrCat(chat ? "chatcmpl-" : "cmpl-",
                         absl::ToUnixMicros(absl::Now()), "-", next_id_++),
      .object = chat ? (stream ? "chat.completion.chunk" : "chat.completion")
                     : "text_completion",
      .created = absl::ToUnixSeconds(absl::Now()),
      .model = options_.model_name,
      .fingerprint = Fingerprint(engine_)};
  OutputParsing parsing = ParsingFor(request->proto);
  if (!chat) parsing.names.clear();
  // Streamed calls are named here (the service names the calls of its
  // last response, which a stream has sent as deltas by then).
  std::string call_id_prefix = absl::StrCat(
      "call_", absl::Hex(absl::ToUnixNanos(absl::Now()) ^ next_id_++), "_");
  CompletionWriter writer(chat, stream, std::max(1, request->proto.n()),
                          request->shape,
                          {.names = std::move(parsing.names),
                           .format = parsing.format,
                           .reasoning = parsing.reasoning},
                          std::move(head), std::move(call_id_prefix), res);
  const absl::Status status = run_(
      request->proto, absl::InfiniteFuture(), [&] { return res.ClientGone(); },
      [&](const v1::GenerateResponse& r) { return writer.Write(r); },
      RequestApi::kHttp);
  if (!status.ok()) {
    if (!writer.started()) return fail(status);
    // Mid-stream: the status line is gone; say it in the stream.
    http_server_error_++;
    res.Write(absl::StrCat("data: ", ErrorJson(status), "\n\n"));
    return;
  }
  if (stream) {
    http_ok_++;
    if (request->include_usage) {
      res.Write(absl::StrCat("data: ", Dump(writer.UsageChunk()), "\n\n"));
    }
    res.Write("data: [DONE]\n\n");
    return;
  }
  http_ok_++;
  res.Send(200, "application/json", Dump(writer.Body()));
}

absl::StatusOr<MemoryShare> OpenAiApi::ChargeBody(const HttpRequest& req,
                                                  int copies) {
  // Counts first, keeping nothing: the DOM costs tens of bytes per
  // element, so a body of millions of tiny elements is refused before it
  // exists.
  OpenAiScanStats scanned;
  RETURN_IF_ERROR(ScanOpenAiRequest(req.body, {}, &scanned));
  if (options_.memory_budget == nullptr) return MemoryShare();
  return options_.memory_budget->Take(
      copies * (static_cast<int64_t>(scanned.values) * kDomBytesPerValue +
                2 * static_cast<int64_t>(req.body.size())),
      "parsing the JSON body");
}

absl::StatusOr<v1::GenerateRequest> OpenAiApi::TranslatedChat(
    const std::string& chat_body, bool* stream) {
  const Json body = Json::parse(chat_body, nullptr, /*allow_exceptions=*/false);
  ResponseShape shape;
  ASSIGN_OR_RETURN(v1::GenerateRequest proto,
                   ToProto(body, chat_body, /*chat=*/true, options_.model_name,
                           context_length_, &shape));
  RETURN_IF_ERROR(Get(body, "stream", stream));
  return proto;
}

OpenAiApi::OutputParsing OpenAiApi::ParsingFor(
    const v1::GenerateRequest& request) const {
  OutputParsing p;
  // Without an engine (the router) the replica's template is unknown: a
  // replica whose template renders no tools refuses them.
  p.names = service_ != nullptr ? service_->ToolCallNames(request)
                                : RequestedToolCallNames(request);
  p.format = options_.tool_call_format;
  p.reasoning = options_.reasoning_format;
  if (service_ != nullptr) {
    p.format = service_->tool_call_format();
    p.reasoning = service_->reasoning_format();
  }
  p.reasoning = RequestReasoningFormat(
      p.reasoning, request.has_enable_thinking()
                       ? std::optional<bool>(request.enable_thinking())
                       : std::nullopt);
  if (p.format == ToolCallFormat::kNone) p.format = ToolCallFormat::kHermes;
  return p;
}

void OpenAiApi::SendError(HttpResponse& res, const absl::Status& status,
                          const std::string& body) {
  (HttpStatusFor(status.code()) < 500 ? http_client_error_
                                      : http_server_error_)++;
  if (status.code() == absl::StatusCode::kResourceExhausted) {
    res.AddHeader("Retry-After", "1");
  }
  res.Send(HttpStatusFor(status.code()), "application/json", body);
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
  AppendMetric(out, "shardlm_ready", "gauge",
               "1 when /ready would answer 200 (every rank up, steps advancing "
               "while requests wait), else 0.",
               {{"", ready ? 1 : 0}});
  AppendSchedulerMetrics(out, s);
  AppendRecoveryMetrics(out, s);
  if (options_.metrics_prefix_cache) {
    AppendMetric(out, "shardlm_prefix_cache_tokens_total", "counter",
                 "Prompt tokens looked up in the prefix cache, and found.",
                 {{"result=\"queried\"", s.blocks.prefix_queries},
                  {"result=\"hit\"", s.blocks.prefix_hit_tokens}});
  }
  AppendMetric(out, "shardlm_http_responses_total", "counter",
               "HTTP API responses by class.",
               {{"class=\"2xx\"", http_ok_.load()},
                {"class=\"4xx\"", http_client_error_.load()},
                {"class=\"5xx\"", http_server_error_.load()}});
  if (const MemoryBudget* b = options_.memory_budget; b != nullptr) {
    AppendMetric(
        out, "shardlm_request_memory_bytes", "gauge",
        "The memory budget of requests in flight (--request-memory-mb): "
        "its limit, the bytes taken now, and the most taken at once.",
        {{"kind=\"limit\"", b->limit()},
         {"kind=\"in_use\"", b->in_use()},
         {"kind=\"peak\"", b->peak()}});
    AppendMetric(
        out, "shardlm_invalid_utf8_total", "counter",
        "gRPC requests refused (INVALID_ARGUMENT) for invalid UTF-8 in a "
        "string field.",
        {{"", service_->invalid_utf8()}});
    AppendMetric(
        out, "shardlm_request_memory_refused_total", "counter",
        "Requests refused because their share of the memory budget did "
        "not fit within 250 ms (429 / RESOURCE_EXHAUSTED).",
        {{"", b->refused()}});
  }
  AppendKvSlotMetrics(out, s);
  // Requests, tokens and latencies of both APIs (api="grpc"|"http").
  absl::StrAppend(&out, engine_->metrics().Prometheus());
  const std::vector<RankReport> ranks = engine_->executor().RankReports();
  AppendRankMetrics(out, ranks, service_->options().tp);
  AppendBuildInfo(out, engine_->executor().backend(),
                  PrecisionName(engine_->precision()),
                  KvCacheDTypeName(engine_->executor().kv_cache_dtype()),
                  std::max<int>(1, static_cast<int>(ranks.size())));
  return out;
}

}  // namespace shardlm
