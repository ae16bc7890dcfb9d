#include "router/router_http.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "api/api_key.h"
#include "nlohmann/json.hpp"

namespace shardlm {
namespace {

// An error in the OpenAI layer's shape ({"error": {message, type, code}}).
std::string ErrorBody(int code, const std::string& type,
                      const std::string& message) {
  return nlohmann::json{
      {"error", {{"message", message}, {"type", type}, {"code", code}}}}
      .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace

RouterHttpApi::RouterHttpApi(ReplicaSet* replicas, RouterService* service,
                             RouterHttpOptions options)
    : replicas_(replicas), service_(service), options_(std::move(options)) {}

RouterHttpApi::~RouterHttpApi() = default;

OpenAiApi* RouterHttpApi::Api() {
  absl::MutexLock lock(&mu_);
  if (api_ != nullptr) return api_.get();
  const std::string model = replicas_->model();
  const int64_t context_length = replicas_->context_length();
  if (model.empty() || context_length <= 0) return nullptr;
  RouterService* service = service_;
  api_ = std::make_unique<OpenAiApi>(
      [service](const v1::GenerateRequest& request, absl::Time deadline,
                const std::function<bool()>& cancelled,
                const std::function<bool(const v1::GenerateResponse&)>& write,
                RequestApi) {
        return service->Run(request, deadline, cancelled, write);
      },
      context_length,
      OpenAiApiOptions{.model_name = model,
                       .api_key = options_.api_key,
                       .metrics_auth = options_.metrics_auth,
                       .memory_budget = options_.memory_budget,
                       .tool_call_format = ToolCallFormatFromName(
                           replicas_->tool_call_format()),
                       .reasoning_format = ReasoningFormatFromName(
                           replicas_->reasoning_format())});
  return api_.get();
}

std::optional<HttpRefusal> RouterHttpApi::CheckHead(const HttpRequest& head) {
  if (OpenAiApi* api = Api()) return api->CheckHead(head);
  if (!absl::StartsWith(head.path, "/v1/") ||
      ApiKeyMatches(head.Header("authorization"), options_.api_key)) {
    return std::nullopt;
  }
  return HttpRefusal{
      .status = 401,
      .body = ErrorBody(401, "authentication_error",
                        "missing or wrong API key (Authorization: Bearer "
                        "<key>)"),
      .headers = {{"WWW-Authenticate", "Bearer"}}};
}

void RouterHttpApi::Handle(const HttpRequest& req, HttpResponse& res) {
  if (req.path == "/health") {
    res.Send(200, "text/plain", "ok\n");
    return;
  }
  if (req.path == "/ready") {
    const int n = replicas_->ready_count();
    if (service_->draining()) {
      res.Send(503, "text/plain", "draining: shutting down\n");
    } else if (n > 0) {
      res.Send(200, "text/plain",
               absl::StrCat(n, " of ", replicas_->size(), " replicas ready\n"));
    } else {
      res.Send(
          503, "text/plain",
          absl::StrCat("no replica is ready: ", replicas_->Describe(), "\n"));
    }
    return;
  }
  if (req.path == "/metrics" && req.method == "GET") {
    if (options_.metrics_auth &&
        !ApiKeyMatches(req.Header("authorization"), options_.api_key)) {
      res.AddHeader("WWW-Authenticate", "Bearer");
      res.Send(401, "application/json",
               ErrorBody(401, "authentication_error",
                         "/metrics needs the API key (Authorization: "
                         "Bearer <key>)"));
      return;
    }
    res.Send(200, "text/plain; version=0.0.4", service_->Metrics());
    return;
  }
  OpenAiApi* api = Api();
  if (api == nullptr) {
    // The key first, as OpenAiApi would (CheckHead saw bodies' heads only).
    if (absl::StartsWith(req.path, "/v1/") &&
        !ApiKeyMatches(req.Header("authorization"), options_.api_key)) {
      res.AddHeader("WWW-Authenticate", "Bearer");
      res.Send(401, "application/json",
               ErrorBody(401, "authentication_error",
                         "missing or wrong API key (Authorization: Bearer "
                         "<key>)"));
      return;
    }
    res.AddHeader("Retry-After", "1");
    res.Send(503, "application/json",
             ErrorBody(503, "server_error",
                       absl::StrCat("no replica has reported its model yet: ",
                                    replicas_->Describe())));
    return;
  }
  api->Handle(req, res);
}

}  // namespace shardlm
