#include "api/api_server.h"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"
#include "api/openai_api.h"
#include "api/replica_state_service.h"
#include "core/status.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/resource_quota.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "grpcpp/support/method_handler.h"

namespace shardlm {
namespace {

constexpr char kServiceName[] = "shardlm.v1.Inference";

// shardlm.v1.Inference with the requests of Generate and Tokenize taken as
// raw bytes (gRPC's generated sync service parses a message before any
// code of ours runs): InferenceService checks the key, takes the budget
// and scans the wire format first, then parses.
class WireService final : public grpc::Service {
 public:
  explicit WireService(InferenceService* service) : service_(service) {
    using grpc::internal::RpcMethod;
    using grpc::internal::RpcServiceMethod;
    AddMethod(new RpcServiceMethod(
        "/shardlm.v1.Inference/Generate", RpcMethod::SERVER_STREAMING,
        new grpc::internal::ServerStreamingHandler<
            WireService, grpc::ByteBuffer, v1::GenerateResponse>(
            [](WireService* s, grpc::ServerContext* context,
               const grpc::ByteBuffer* request,
               grpc::ServerWriter<v1::GenerateResponse>* writer) {
              return s->service_->GenerateWire(context, *request, writer);
            },
            this)));
    AddMethod(new RpcServiceMethod(
        "/shardlm.v1.Inference/Tokenize", RpcMethod::NORMAL_RPC,
        new grpc::internal::RpcMethodHandler<WireService, grpc::ByteBuffer,
                                             v1::TokenizeResponse>(
            [](WireService* s, grpc::ServerContext* context,
               const grpc::ByteBuffer* request,
               v1::TokenizeResponse* response) {
              return s->service_->TokenizeWire(context, *request, response);
            },
            this)));
    AddMethod(new RpcServiceMethod(
        "/shardlm.v1.Inference/GetModelInfo", RpcMethod::NORMAL_RPC,
        new grpc::internal::RpcMethodHandler<
            WireService, v1::GetModelInfoRequest, v1::ModelInfo,
            grpc::protobuf::MessageLite, grpc::protobuf::MessageLite>(
            [](WireService* s, grpc::ServerContext* context,
               const v1::GetModelInfoRequest* request,
               v1::ModelInfo* response) {
              return s->service_->GetModelInfo(context, request, response);
            },
            this)));
  }

 private:
  InferenceService* service_;  // Not owned.
};

}  // namespace

std::shared_ptr<grpc::ServerCredentials> GrpcServerCredentials(
    const TlsConfig& tls) {
  if (!tls.enabled()) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions ssl(
      tls.client_ca_pem.empty()
          ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
          : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  ssl.pem_root_certs = tls.client_ca_pem;
  ssl.pem_key_cert_pairs.push_back(
      {.private_key = tls.private_key_pem, .cert_chain = tls.cert_chain_pem});
  return grpc::SslServerCredentials(ssl);
}

absl::StatusOr<std::unique_ptr<ApiServer>> ApiServer::Start(
    Engine* engine, const Tokenizer* tokenizer,
    const ApiServerOptions& options) {
  if (options.metrics_auth && options.service.api_key.empty()) {
    return absl::InvalidArgumentError(
        "--metrics-auth needs an API key (set SHARDLM_API_KEY)");
  }
  std::unique_ptr<ApiServer> s(new ApiServer());
  s->engine_ = engine;
  s->budget_ = std::make_unique<MemoryBudget>(
      options.request_memory_bytes > 0 ? options.request_memory_bytes
                                       : MemoryBudget::DefaultLimitBytes());
  ServiceOptions service_options = options.service;
  service_options.memory_budget = s->budget_.get();
  s->service_ = std::make_unique<InferenceService>(
      engine, tokenizer, options.model_name, service_options);

  // Both are process-wide switches read when a builder is made; setting
  // them again is harmless.
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.listen_address,
                           GrpcServerCredentials(options.tls), &s->port_);
  s->wire_service_ = std::make_unique<WireService>(s->service_.get());
  builder.RegisterService(s->wire_service_.get());
  s->state_service_ = std::make_unique<ReplicaStateService>(
      engine, s->service_.get(), options.metrics_prefix_cache);
  builder.RegisterService(s->state_service_.get());
  // A burst of streams costs threads up to this cap, then
  // RESOURCE_EXHAUSTED; a few threads more keep the health service and
  // short calls answering.
  grpc::ResourceQuota quota("shardlm-api");
  quota.SetMaxThreads(std::max(4, options.max_grpc_calls + 8));
  builder.SetResourceQuota(quota);
  // gRPC's default is 4 MiB; no legitimate request needs more than this,
  // and a larger one is refused before it is parsed.
  builder.SetMaxReceiveMessageSize(
      static_cast<int>(MaxGrpcRequestBytes(service_options.max_prompt_bytes)));
  s->server_ = builder.BuildAndStart();
  if (s->server_ == nullptr || s->port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", options.listen_address,
                     " (malformed address, or the port is in use)"));
  }
  if (!options.http_listen_address.empty()) {
    const auto& chat = s->service_->chat_template();
    std::fprintf(stderr, "[shardlm] chat completions: %s\n",
                 chat.ok() ? chat->Describe().c_str()
                           : std::string(chat.status().message()).c_str());
    s->openai_ = std::make_unique<OpenAiApi>(
        engine, s->service_.get(),
        OpenAiApiOptions{.model_name = options.model_name,
                         .api_key = options.service.api_key,
                         .metrics_auth = options.metrics_auth,
                         .metrics_prefix_cache = options.metrics_prefix_cache,
                         .memory_budget = s->budget_.get()});
    HttpServerOptions http;
    http.listen_address = options.http_listen_address;
    http.tls = options.tls;
    http.memory_budget = s->budget_.get();
    http.idle_thread_timeout = options.idle_thread_timeout;
    ASSIGN_OR_RETURN(s->http_, StartApiHttp(s->openai_.get(), std::move(http)));
  }
  // The first status before Start returns: a client's first Check must not
  // find the service unknown.
  if (grpc::HealthCheckServiceInterface* health =
          s->server_->GetHealthCheckService()) {
    const bool serving = engine->executor().Health().ok();
    health->SetServingStatus("", serving);
    health->SetServingStatus(kServiceName, serving);
  }
  s->health_thread_ = std::thread(
      [p = s.get(), poll = options.health_poll] { p->WatchHealth(poll); });
  return s;
}

void ApiServer::WatchHealth(std::chrono::milliseconds poll) {
  grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService();
  if (health == nullptr) return;
  absl::MutexLock lock(&mu_);
  const auto woken = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || recheck_;
  };
  while (!stopping_) {
    const bool serving =
        !service_->draining() && engine_->executor().Health().ok();
    health->SetServingStatus("", serving);
    health->SetServingStatus(kServiceName, serving);
    mu_.AwaitWithTimeout(absl::Condition(&woken), absl::FromChrono(poll));
    recheck_ = false;
  }
}

void ApiServer::Wait() { server_->Wait(); }

void ApiServer::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;  // WatchHealth's Await sees it.
  }
  if (health_thread_.joinable()) health_thread_.join();
  // HTTP streams end when their connections close; their requests are
  // cancelled within one engine step.
  if (http_ != nullptr) http_->Shutdown();
  if (server_ == nullptr) return;  // Start() failed.
  // A second of grace; then in-flight calls are cancelled and see
  // IsCancelled() within one engine step.
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
}

bool ApiServer::Drain(absl::Duration timeout,
                      const std::function<bool()>& interrupted) {
  service_->StartDraining();
  {
    absl::MutexLock lock(&mu_);
    recheck_ = true;  // WatchHealth says NOT_SERVING now, not a poll later.
  }
  const absl::Time deadline = absl::Now() + timeout;
  bool drained = false;
  while (true) {
    if (service_->in_flight() == 0) {
      drained = true;
      break;
    }
    if (absl::Now() >= deadline) break;
    if (!interrupted) {
      absl::SleepFor(absl::Milliseconds(50));
    } else if (interrupted()) {
      break;
    }
  }
  Shutdown();
  return drained;
}

ApiServer::~ApiServer() { Shutdown(); }

}  // namespace shardlm
