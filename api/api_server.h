// The server of both public APIs (DESIGN.md section 6): shardlm.v1.Inference
// over gRPC next to the standard health service and server reflection, and
// the OpenAI-style HTTP API, sharing one InferenceService and one memory
// budget for the requests in flight.
#ifndef SHARDLM_API_API_SERVER_H_
#define SHARDLM_API_API_SERVER_H_

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "api/inference_service.h"
#include "engine/engine.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "http/http_server.h"
#include "http/memory_budget.h"
#include "http/tls.h"
#include "model/tokenizer.h"

namespace shardlm {

class OpenAiApi;
class ReplicaStateService;

// gRPC server credentials for `tls` (mutual TLS with a client CA), or
// insecure ones when it is not enabled. The router uses them too.
std::shared_ptr<grpc::ServerCredentials> GrpcServerCredentials(
    const TlsConfig& tls);

struct ApiServerOptions {
  // "host:port"; port 0 binds a free port (see ApiServer::port()).
  std::string listen_address = "127.0.0.1:0";
  std::string model_name;
  ServiceOptions service;
  // How often the executor's health is polled for the health service.
  std::chrono::milliseconds health_poll{1000};
  // "host:port" of the HTTP API (OpenAI-style routes, /metrics, /health,
  // /ready); empty: none. ServiceOptions.api_key guards both.
  std::string http_listen_address;
  // Most gRPC calls handled at once (each holds a server thread while it
  // streams); calls beyond it get RESOURCE_EXHAUSTED at once, and the
  // engine's own queue (max_queued) refuses beyond that.
  int max_grpc_calls = 512;
  // Both APIs on TLS when enabled (mutual TLS with a client CA).
  TlsConfig tls;
  // See OpenAiApiOptions (metrics_auth needs service.api_key).
  bool metrics_auth = false;
  bool metrics_prefix_cache = false;
  // Bytes the requests in flight may cost (both APIs; see MemoryBudget);
  // 0: MemoryBudget::DefaultLimitBytes(). service.memory_budget is set to
  // the server's own budget.
  int64_t request_memory_bytes = 0;
  // HTTP pool threads above the base exit after this long idle.
  std::chrono::milliseconds idle_thread_timeout{10000};
};

// A started gRPC server: shardlm.v1.Inference, grpc.health.v1.Health (the
// overall status "" and "shardlm.v1.Inference": SERVING while the engine's
// executor is healthy) and server reflection. Shuts down on destruction.
class ApiServer {
 public:
  // Builds and starts the server. `engine` and `tokenizer` are not owned
  // and must outlive the server. Unavailable naming the address when it
  // cannot be bound.
  static absl::StatusOr<std::unique_ptr<ApiServer>> Start(
      Engine* engine, const Tokenizer* tokenizer,
      const ApiServerOptions& options);
  ~ApiServer();
  ApiServer(const ApiServer&) = delete;
  ApiServer& operator=(const ApiServer&) = delete;

  int port() const { return port_; }
  // The HTTP API's port; 0 without one.
  int http_port() const { return http_ == nullptr ? 0 : http_->port(); }
  // Blocks until Shutdown() (from another thread).
  void Wait();
  // Stops accepting calls, gives in-flight ones a second, then cancels them
  // (a Generate stops within one engine step) and returns when all are
  // done. Idempotent; called by the destructor.
  void Shutdown();
  // A graceful stop: the health service and /ready say not serving at
  // once, new requests get UNAVAILABLE (HTTP 503), and requests in flight
  // run to their end. Returns true once none is left, false when `timeout`
  // passed or `interrupted` said so first; either way then Shutdown()
  // (which cancels what is left). `interrupted` paces the polling (it may
  // block up to ~50 ms; null: the loop sleeps 50 ms itself).
  bool Drain(absl::Duration timeout,
             const std::function<bool()>& interrupted = nullptr);
  grpc::Server* server() { return server_.get(); }

 private:
  ApiServer() = default;
  void WatchHealth(std::chrono::milliseconds poll);

  const Engine* engine_ = nullptr;
  std::unique_ptr<MemoryBudget> budget_;  // Outlives both servers below.
  std::unique_ptr<InferenceService> service_;
  // shardlm.v1.Inference as registered: reads each request's bytes raw,
  // so that the key and the budget are checked before the parse.
  std::unique_ptr<grpc::Service> wire_service_;
  // shardlm.v1.ReplicaState, which routers watch.
  std::unique_ptr<ReplicaStateService> state_service_;
  std::unique_ptr<OpenAiApi> openai_;
  std::unique_ptr<HttpServer> http_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool recheck_ ABSL_GUARDED_BY(mu_) = false;  // WatchHealth looks again now.
  std::thread health_thread_;
};

}  // namespace shardlm

#endif  // SHARDLM_API_API_SERVER_H_
