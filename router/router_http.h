// The router's HTTP face (docs/router.md): the OpenAI-style API
// (/v1/completions, /v1/chat/completions, /v1/models) through the
// coordinator's own OpenAiApi, whose requests run on RouterService::Run
// (routed, retried and resumed as gRPC calls are), plus the router's
// /health, /ready and /metrics.
#ifndef SHARDLM_ROUTER_ROUTER_HTTP_H_
#define SHARDLM_ROUTER_ROUTER_HTTP_H_

#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "api/openai_api.h"
#include "http/http_server.h"
#include "http/memory_budget.h"
#include "router/replica_set.h"
#include "router/router_service.h"

namespace shardlm {

struct RouterHttpOptions {
  // /v1/* needs "Authorization: Bearer <api_key>" when set (as on a
  // replica); the probes stay open, /metrics too unless metrics_auth.
  std::string api_key;
  bool metrics_auth = false;
  // Bodies and their parse are charged to it (not owned; may be null).
  MemoryBudget* memory_budget = nullptr;
};

// Thread-safe. `replicas` and `service` are not owned and outlive it.
class RouterHttpApi {
 public:
  RouterHttpApi(ReplicaSet* replicas, RouterService* service,
                RouterHttpOptions options);
  ~RouterHttpApi();

  // An HttpHandler.
  void Handle(const HttpRequest& request, HttpResponse& response);
  // An HttpHeadCheck: the API key, before the body is read.
  std::optional<HttpRefusal> CheckHead(const HttpRequest& head);

 private:
  // The OpenAI layer, made once a replica has reported its model's name
  // and context length (every replica serves that one); null before.
  OpenAiApi* Api();

  ReplicaSet* replicas_;
  RouterService* service_;
  const RouterHttpOptions options_;
  absl::Mutex mu_;
  std::unique_ptr<OpenAiApi> api_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shardlm

#endif  // SHARDLM_ROUTER_ROUTER_HTTP_H_
