// The HTTP face of the coordinator (DESIGN.md section 6): OpenAI-compatible
// /v1/completions, /v1/chat/completions (both with SSE streaming) and
// /v1/models, Prometheus /metrics, and the /health (live) and /ready
// (ready and making progress) probes. Requests run through the same
// InferenceService as gRPC calls, so validation, stop strings, logprobs and
// errors are the same; only the encoding differs.
#ifndef SHARDLM_API_OPENAI_API_H_
#define SHARDLM_API_OPENAI_API_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "api/inference_service.h"
#include "engine/engine.h"
#include "http/http_server.h"
#include "http/memory_budget.h"

namespace shardlm {

class ResponseStore;

struct OpenAiApiOptions {
  std::string model_name;
  // When not empty, /v1/* needs "Authorization: Bearer <api_key>" (401
  // otherwise); the probes and /metrics stay open.
  std::string api_key;
  // /ready fails when requests are in the engine but no step ran for this
  // long.
  absl::Duration stall_timeout = absl::Seconds(60);
  // /metrics needs the API key too.
  bool metrics_auth = false;
  // /metrics shows the prefix cache's hits. Off by default: a client that
  // can read the counters learns, by sending a prompt and watching them,
  // whether someone sent the same beginning before.
  bool metrics_prefix_cache = false;
  // When set (not owned), a body's parse is charged to it before the DOM is
  // built, and /metrics shows it.
  MemoryBudget* memory_budget = nullptr;
  // Without an engine (the router): how the replicas' template writes tool
  // calls, which the content filter parses (with an engine, its template
  // says). kNone reads as Hermes, the format before replicas reported it.
  ToolCallFormat tool_call_format = ToolCallFormat::kHermes;
  // The same for reasoning, split into reasoning_content.
  ReasoningFormat reasoning_format = ReasoningFormat::kNone;
};

// Runs one request as InferenceService::Run does (the router's forwarding
// has the same contract).
using CompletionRunner = std::function<absl::Status(
    const v1::GenerateRequest& request, absl::Time deadline,
    const std::function<bool()>& cancelled,
    const std::function<bool(const v1::GenerateResponse&)>& write,
    RequestApi api)>;

// Thread-safe; `engine` and `service` are not owned and must outlive it.
class OpenAiApi {
 public:
  OpenAiApi(Engine* engine, InferenceService* service,
            OpenAiApiOptions options);
  // Without an engine (the router, docs/router.md): requests run on `run`,
  // for a model of `context_length` tokens; Handle serves /health and /v1/
  // only (/ready and /metrics are the caller's to answer).
  OpenAiApi(CompletionRunner run, int64_t context_length,
            OpenAiApiOptions options);
  ~OpenAiApi();

  // An HttpHandler.
  void Handle(const HttpRequest& request, HttpResponse& response);
  // An HttpHeadCheck: a request to /v1/ without the API key (when one is
  // set) is refused before its body is read, with the 401 Handle would send.
  std::optional<HttpRefusal> CheckHead(const HttpRequest& head);

  // The Prometheus text exposition of the engine's figures.
  std::string Metrics();
  // OK when every rank is up and, with requests in the engine, a step ran
  // within stall_timeout; Unavailable saying which is not.
  absl::Status Ready();

 private:
  void Complete(const HttpRequest& request, HttpResponse& response, bool chat);
  // POST /v1/messages (api/messages_api.h).
  void Messages(const HttpRequest& request, HttpResponse& response);
  // POST /v1/responses (api/responses_api.h).
  void Responses(const HttpRequest& request, HttpResponse& response);
  // Whether the request carries the API key: "Authorization: Bearer KEY",
  // or Anthropic's "x-api-key: KEY".
  bool KeyOk(const HttpRequest& request) const;

  // What the endpoints share. The body's scan, and its parse charged to the
  // memory budget (`copies` DOMs of it: 2 for a translated body).
  absl::StatusOr<MemoryShare> ChargeBody(const HttpRequest& request,
                                         int copies);
  // The chat request of a translated body (Messages, Responses), and
  // whether it streams.
  absl::StatusOr<v1::GenerateRequest> TranslatedChat(
      const std::string& chat_body, bool* stream);
  // How a chat request's output is parsed: the tools it may call and the
  // template's formats of calls and reasoning.
  struct OutputParsing {
    std::vector<std::string> names;
    ToolCallFormat format = ToolCallFormat::kHermes;
    ReasoningFormat reasoning = ReasoningFormat::kNone;
  };
  OutputParsing ParsingFor(const v1::GenerateRequest& request) const;
  // Sends `body` with the status for `status` (and Retry-After on
  // RESOURCE_EXHAUSTED), counted for /metrics.
  void SendError(HttpResponse& response, const absl::Status& status,
                 const std::string& body);

  Engine* engine_;             // Null without an engine.
  InferenceService* service_;  // Null without an engine.
  CompletionRunner run_;
  int64_t context_length_;
  OpenAiApiOptions options_;
  std::atomic<int64_t> next_id_{0};
  // /v1/responses' "store": true (api/responses_api.h).
  std::unique_ptr<ResponseStore> responses_;
  absl::Mutex ready_mu_;
  int64_t last_steps_ ABSL_GUARDED_BY(ready_mu_) = -1;
  absl::Time last_progress_ ABSL_GUARDED_BY(ready_mu_);
  // Counters by outcome, for /metrics.
  std::atomic<int64_t> http_ok_{0}, http_client_error_{0},
      http_server_error_{0};
};

// HTTP status for an absl status code (INVALID_ARGUMENT 400,
// UNAUTHENTICATED 401, NOT_FOUND 404, RESOURCE_EXHAUSTED 429, CANCELLED
// 499, UNAVAILABLE 503, DEADLINE_EXCEEDED 504, others 500).
int HttpStatusFor(absl::StatusCode code);

}  // namespace shardlm

#endif  // SHARDLM_API_OPENAI_API_H_
