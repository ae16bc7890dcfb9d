// shardlm.v1.Inference as a router serves it (DESIGN.md section 1): each
// Generate goes to the replica the routing policy picks and its responses
// come back unchanged. A call that fails with UNAVAILABLE before any
// response reached the client is retried once on another replica; one
// that fails with UNAVAILABLE mid-stream is resumed on another replica
// through the resume API (resume_token_ids: the tokens the client already
// has), so the client's text is the undisturbed one. Priority travels in
// the request; the client's deadline and cancellation travel with the
// call (ClientContext::FromServerContext); the client's API key is passed
// on (the router's own when the client sent none).
//
// A replica that stops sending state (no update for stall_after) has its
// calls cancelled and handled as failed with UNAVAILABLE, so that a hung
// replica does not hold a stream forever (one taken out of the replica
// list is no longer watched: its calls run on, under their deadline).
#ifndef SHARDLM_ROUTER_ROUTER_SERVICE_H_
#define SHARDLM_ROUTER_ROUTER_SERVICE_H_

#include <atomic>
#include <functional>
#include <list>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "engine/serving_metrics.h"
#include "http/memory_budget.h"
#include "model/chat_template.h"
#include "model/tokenizer.h"
#include "router/replica_set.h"
#include "router/routing_policy.h"
#include "shardlm/v1/inference.grpc.pb.h"

namespace shardlm {

struct RouterServiceOptions {
  RoutingOptions routing;
  // Clients must send "authorization: Bearer <key>"; empty: anything.
  std::string api_key;
  // Resumptions of one stream after mid-stream failures.
  int max_resumes = 2;
  // A replica whose state stream said nothing for this long has its
  // calls cancelled (then retried or resumed elsewhere).
  absl::Duration stall_after = absl::Seconds(3);
};

class RouterService final : public v1::Inference::Service {
 public:
  // `replicas` is not owned and outlives the service. `tokenizer` (not
  // owned; may be null) turns prompts into the token ids kv routing
  // hashes; without one only prompt_token_ids are hashed and text prompts
  // are routed by load.
  RouterService(ReplicaSet* replicas, const Tokenizer* tokenizer,
                RouterServiceOptions options);
  ~RouterService() override;

  grpc::Status Generate(
      grpc::ServerContext* context, const v1::GenerateRequest* request,
      grpc::ServerWriter<v1::GenerateResponse>* writer) override;
  grpc::Status Tokenize(grpc::ServerContext* context,
                        const v1::TokenizeRequest* request,
                        v1::TokenizeResponse* response) override;
  grpc::Status GetModelInfo(grpc::ServerContext* context,
                            const v1::GetModelInfoRequest* request,
                            v1::ModelInfo* response) override;

  // Generate without gRPC (the router's HTTP API, through OpenAiApi), with
  // InferenceService::Run's contract: routed, retried and resumed as a
  // gRPC call is; `deadline` bounds the calls to replicas; `cancelled` is
  // polled (every 100 ms, and before each response is handed to `write`)
  // and cancels the call; `write` returning false does too (Cancelled).
  // The router's own API key goes to the replicas (the caller checked the
  // client's).
  absl::Status Run(
      const v1::GenerateRequest& request, absl::Time deadline,
      const std::function<bool()>& cancelled,
      const std::function<bool(const v1::GenerateResponse&)>& write);

  // Prometheus text: requests per replica, retries, resumes, predicted
  // prefix blocks, routing decision time, replicas ready.
  std::string Metrics() const;
  int64_t retries() const { return retries_.load(); }

  // Draining (SIGTERM): from now on Generate (both APIs) refuses new
  // requests with UNAVAILABLE; those already in it run to their end. Not
  // undone.
  void StartDraining() { draining_ = true; }
  bool draining() const { return draining_.load(); }
  // Generate calls in progress (either API).
  int64_t in_flight() const { return in_flight_.load(); }
  int64_t resumes() const { return resumes_.load(); }

  // The prompt's token ids as a replica's engine will see them (chat
  // template, truncation), or empty when the router cannot know them.
  std::vector<int32_t> PromptTokens(const v1::GenerateRequest& request) const;

  // OK, or UNAUTHENTICATED when the call lacks the API key.
  grpc::Status CheckKey(const grpc::ServerContext& context) const;

 private:
  // One call in flight to a replica, for the stall watchdog.
  struct Call {
    int replica;
    grpc::ClientContext* context;
    // Polled by the watchdog; null when cancellation travels by itself
    // (a gRPC client's, through ClientContext::FromServerContext).
    const std::function<bool()>* client_gone = nullptr;
    std::atomic<bool> stalled{false};
  };
  // A client context for a call on behalf of `context`: its deadline and
  // cancellation, and the key.
  std::unique_ptr<grpc::ClientContext> Upstream(
      grpc::ServerContext* context) const;
  int Choose(absl::Span<const int32_t> prompt, int exclude);
  // Generate for either API: each attempt's context comes from `upstream`
  // (deadline, cancellation, key); `client_gone` says the client left (for
  // the watchdog; null: gRPC propagates it); `write` hands a response on
  // (false: the client is gone).
  grpc::Status Forward(
      const v1::GenerateRequest& request,
      const std::function<std::unique_ptr<grpc::ClientContext>()>& upstream,
      const std::function<bool()>& client_gone, bool watch_client,
      const std::function<bool(const v1::GenerateResponse&)>& write);
  void WatchStalls();

  ReplicaSet* replicas_;
  const Tokenizer* tokenizer_;
  absl::StatusOr<ChatTemplate> chat_template_;
  const RouterServiceOptions options_;
  absl::Mutex policy_mu_;
  RoutingPolicy policy_ ABSL_GUARDED_BY(policy_mu_);
  Histogram decision_seconds_;
  std::atomic<int64_t> retries_{0}, resumes_{0}, no_replica_{0};
  std::atomic<bool> draining_{false};
  std::atomic<int64_t> in_flight_{0};

  absl::Mutex calls_mu_;
  std::list<Call*> calls_ ABSL_GUARDED_BY(calls_mu_);
  bool stopping_ ABSL_GUARDED_BY(calls_mu_) = false;
  std::thread watchdog_;
};

// shardlm.v1.Inference as the router registers it: requests are taken as
// raw bytes and parsed here, so that a message that is not a valid request
// is INVALID_ARGUMENT saying so (the generated service would answer
// INTERNAL), as on a replica. As on a replica too, the API key is checked
// and the request's share of `budget` (three times its bytes: as received,
// flattened, parsed) taken before the parse, and held until the call ends.
// `service` and `budget` (may be null) are not owned and outlive it.
std::unique_ptr<grpc::Service> RouterWireService(
    RouterService* service, MemoryBudget* budget = nullptr);

}  // namespace shardlm

#endif  // SHARDLM_ROUTER_ROUTER_SERVICE_H_
