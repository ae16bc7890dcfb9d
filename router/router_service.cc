#include "router/router_service.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "api/api_key.h"
#include "grpcpp/client_context.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/method_handler.h"

namespace shardlm {
namespace {

// Routing decisions take microseconds: buckets from 1 us to 10 ms.
std::vector<double> DecisionBuckets() {
  return {1e-6, 2e-6, 5e-6, 1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 1e-2};
}

grpc::Status Named(const grpc::Status& s, const std::string& address) {
  return grpc::Status(s.error_code(), absl::StrCat("replica ", address, ": ",
                                                   s.error_message()));
}

// `request` parsed as a T, or INVALID_ARGUMENT naming what it should be;
// with a budget, its share taken into `share` first (RESOURCE_EXHAUSTED
// when it does not fit).
template <typename T>
grpc::Status Parse(const grpc::ByteBuffer& request, const char* what,
                   MemoryBudget* budget, MemoryShare* share, T* out) {
  if (budget != nullptr) {
    absl::StatusOr<MemoryShare> taken = budget->Take(
        3 * static_cast<int64_t>(request.Length()) + 4096, "the gRPC message");
    if (!taken.ok()) {
      return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                          std::string(taken.status().message()));
    }
    *share = *std::move(taken);
  }
  std::vector<grpc::Slice> slices;
  std::string bytes;
  if (request.Dump(&slices).ok()) {
    for (const grpc::Slice& s : slices) {
      bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
    }
  }
  if (!out->ParseFromString(bytes)) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("the request is not a valid ", what,
                                     " message (", bytes.size(), " bytes)"));
  }
  return grpc::Status::OK;
}

class WireService final : public grpc::Service {
 public:
  WireService(RouterService* service, MemoryBudget* budget)
      : service_(service), budget_(budget) {
    using grpc::internal::RpcMethod;
    using grpc::internal::RpcServiceMethod;
    AddMethod(new RpcServiceMethod(
        "/shardlm.v1.Inference/Generate", RpcMethod::SERVER_STREAMING,
        new grpc::internal::ServerStreamingHandler<
            WireService, grpc::ByteBuffer, v1::GenerateResponse>(
            [](WireService* s, grpc::ServerContext* context,
               const grpc::ByteBuffer* request,
               grpc::ServerWriter<v1::GenerateResponse>* writer) {
              if (grpc::Status st = s->service_->CheckKey(*context); !st.ok()) {
                return st;
              }
              MemoryShare share;
              v1::GenerateRequest parsed;
              grpc::Status st = Parse(*request, "GenerateRequest", s->budget_,
                                      &share, &parsed);
              if (!st.ok()) return st;
              return s->service_->Generate(context, &parsed, writer);
            },
            this)));
    AddMethod(new RpcServiceMethod(
        "/shardlm.v1.Inference/Tokenize", RpcMethod::NORMAL_RPC,
        new grpc::internal::RpcMethodHandler<WireService, grpc::ByteBuffer,
                                             v1::TokenizeResponse>(
            [](WireService* s, grpc::ServerContext* context,
               const grpc::ByteBuffer* request,
               v1::TokenizeResponse* response) {
              if (grpc::Status st = s->service_->CheckKey(*context); !st.ok()) {
                return st;
              }
              MemoryShare share;
              v1::TokenizeRequest parsed;
              grpc::Status st = Parse(*request, "TokenizeRequest", s->budget_,
                                      &share, &parsed);
              if (!st.ok()) return st;
              return s->service_->Tokenize(context, &parsed, response);
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
  RouterService* service_;  // Not owned.
  MemoryBudget* budget_;    // Not owned; may be null.
};

}  // namespace

std::unique_ptr<grpc::Service> RouterWireService(RouterService* service,
                                                 MemoryBudget* budget) {
  return std::make_unique<WireService>(service, budget);
}

RouterService::RouterService(ReplicaSet* replicas, const Tokenizer* tokenizer,
                             RouterServiceOptions options)
    : replicas_(replicas),
      tokenizer_(tokenizer),
      chat_template_(tokenizer != nullptr
                         ? ChatTemplate::ForModel(*tokenizer)
                         : absl::FailedPreconditionError("no tokenizer")),
      options_(std::move(options)),
      policy_(options_.routing),
      decision_seconds_(DecisionBuckets()) {
  watchdog_ = std::thread([this] { WatchStalls(); });
}

RouterService::~RouterService() {
  {
    absl::MutexLock lock(&calls_mu_);
    stopping_ = true;
  }
  watchdog_.join();
}

void RouterService::WatchStalls() {
  absl::MutexLock lock(&calls_mu_);
  while (!stopping_) {
    for (Call* c : calls_) {
      // A replica taken out of the list is no longer watched: its calls
      // run on (a broken one still ends them), guarded by their deadline.
      if (c->client_gone != nullptr && (*c->client_gone)()) {
        c->context->TryCancel();  // Forward sees client_gone() after.
        continue;
      }
      if (!c->stalled.load() && !replicas_->Removed(c->replica) &&
          replicas_->SilentFor(c->replica) > options_.stall_after) {
        c->stalled = true;
        c->context->TryCancel();
      }
    }
    calls_mu_.AwaitWithTimeout(absl::Condition(&stopping_),
                               absl::Milliseconds(100));
  }
}

grpc::Status RouterService::CheckKey(const grpc::ServerContext& context) const {
  if (options_.api_key.empty()) return grpc::Status::OK;
  const auto& metadata = context.client_metadata();
  const auto it = metadata.find("authorization");
  if (it == metadata.end() ||
      !ApiKeyMatches(absl::string_view(it->second.data(), it->second.size()),
                     options_.api_key)) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "missing or wrong API key (metadata authorization: "
                        "Bearer <key>; shardlm generate reads "
                        "SHARDLM_API_KEY)");
  }
  return grpc::Status::OK;
}

std::unique_ptr<grpc::ClientContext> RouterService::Upstream(
    grpc::ServerContext* context) const {
  std::unique_ptr<grpc::ClientContext> ctx =
      grpc::ClientContext::FromServerContext(*context);
  const auto& metadata = context->client_metadata();
  const auto it = metadata.find("authorization");
  if (it != metadata.end()) {
    ctx->AddMetadata("authorization",
                     std::string(it->second.data(), it->second.size()));
  } else if (!options_.api_key.empty()) {
    ctx->AddMetadata("authorization", "Bearer " + options_.api_key);
  }
  return ctx;
}

std::vector<int32_t> RouterService::PromptTokens(
    const v1::GenerateRequest& request) const {
  std::vector<int32_t> tokens;
  if (request.messages_size() > 0) {
    if (tokenizer_ == nullptr || !chat_template_.ok()) return tokens;
    std::vector<ChatMessage> conversation;
    for (const v1::ChatMessage& m : request.messages()) {
      conversation.push_back({m.role(), m.content()});
    }
    absl::StatusOr<std::string> text = chat_template_->Render(conversation);
    if (!text.ok()) return tokens;
    tokens = tokenizer_->EncodePrompt(*text);
  } else if (request.prompt_token_ids_size() > 0) {
    tokens.assign(request.prompt_token_ids().begin(),
                  request.prompt_token_ids().end());
  } else if (tokenizer_ != nullptr) {
    tokens = tokenizer_->EncodePrompt(request.prompt());
  }
  const size_t keep =
      request.truncate_prompt_tokens() > 0
          ? static_cast<size_t>(request.truncate_prompt_tokens())
          : 0;
  if (keep > 0 && tokens.size() > keep) {
    tokens.erase(tokens.begin(), tokens.end() - keep);
  }
  return tokens;
}

int RouterService::Choose(absl::Span<const int32_t> prompt, int exclude) {
  const absl::Time start = absl::Now();
  RouteDecision d;
  {
    absl::MutexLock lock(&policy_mu_);
    d = replicas_->Route(policy_, prompt, exclude);
  }
  decision_seconds_.Observe(absl::ToDoubleSeconds(absl::Now() - start));
  if (d.replica >= 0) {
    replicas_->counters(d.replica).requests++;
    replicas_->counters(d.replica).predicted_hit_blocks += d.cached_blocks;
  }
  return d.replica;
}

grpc::Status RouterService::Generate(
    grpc::ServerContext* context, const v1::GenerateRequest* request,
    grpc::ServerWriter<v1::GenerateResponse>* writer) {
  if (grpc::Status s = CheckKey(*context); !s.ok()) return s;
  return Forward(
      *request, [&] { return Upstream(context); },
      [context] { return context->IsCancelled(); }, /*watch_client=*/false,
      [writer](const v1::GenerateResponse& r) { return writer->Write(r); });
}

absl::Status RouterService::Run(
    const v1::GenerateRequest& request, absl::Time deadline,
    const std::function<bool()>& cancelled,
    const std::function<bool(const v1::GenerateResponse&)>& write) {
  const auto upstream = [&] {
    auto ctx = std::make_unique<grpc::ClientContext>();
    if (deadline != absl::InfiniteFuture()) {
      ctx->set_deadline(absl::ToChronoTime(deadline));
    }
    if (!options_.api_key.empty()) {
      ctx->AddMetadata("authorization", "Bearer " + options_.api_key);
    }
    return ctx;
  };
  const grpc::Status s = Forward(
      request, upstream, cancelled, /*watch_client=*/true,
      [&](const v1::GenerateResponse& r) { return !cancelled() && write(r); });
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      s.error_message());
}

grpc::Status RouterService::Forward(
    const v1::GenerateRequest& request,
    const std::function<std::unique_ptr<grpc::ClientContext>()>& make_upstream,
    const std::function<bool()>& client_gone, bool watch_client,
    const std::function<bool(const v1::GenerateResponse&)>& write) {
  // Counted before draining is looked at, so that a drain that saw no call
  // in flight cannot miss one that got past the check.
  ++in_flight_;
  struct Done {
    std::atomic<int64_t>& n;
    ~Done() { --n; }
  } done{in_flight_};
  if (draining_.load()) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        "draining: the router is shutting down");
  }
  // Only kv hashes the prompt; the other policies need no tokens.
  const std::vector<int32_t> prompt =
      options_.routing.kind == RoutingPolicyKind::kKv ? PromptTokens(request)
                                                      : std::vector<int32_t>();
  const int32_t max_tokens =
      request.max_tokens() > 0 ? request.max_tokens() : 16;
  // What this call sends: the request, plus (after a mid-stream failure)
  // every token the client has been sent.
  v1::GenerateRequest forward = request;
  // n > 1: several sequences in one stream (GenerateResponse.index); the
  // resume API takes one, so such a stream is not resumed.
  const int choices = std::max(1, request.n());
  bool retried = false;
  int resumed = 0;
  int failed = -1;  // The replica the last attempt failed on.
  while (true) {
    const int r = Choose(prompt, failed);
    if (r < 0) {
      ++no_replica_;
      return grpc::Status(
          grpc::StatusCode::UNAVAILABLE,
          absl::StrCat("no replica is ready: ", replicas_->Describe()));
    }
    std::unique_ptr<grpc::ClientContext> upstream = make_upstream();
    Call call{.replica = r,
              .context = upstream.get(),
              .client_gone = watch_client ? &client_gone : nullptr};
    {
      absl::MutexLock lock(&calls_mu_);
      calls_.push_back(&call);
    }
    bool wrote = false;
    int finished = 0;  // Choices whose last response (finish_reason) was sent.
    grpc::Status s;
    {
      auto reader = replicas_->stub(r).Generate(upstream.get(), forward);
      v1::GenerateResponse response;
      bool left = false;
      while (reader->Read(&response)) {
        if (choices == 1) {
          for (int32_t t : response.token_ids()) {
            forward.add_resume_token_ids(t);
          }
        }
        if (!write(response)) {
          left = true;
          upstream->TryCancel();
          break;
        }
        wrote = true;
        finished += !response.finish_reason().empty();
      }
      s = reader->Finish();
      if (left) s = grpc::Status(grpc::StatusCode::CANCELLED, "");
    }
    {
      absl::MutexLock lock(&calls_mu_);
      calls_.remove(&call);
    }
    if (call.stalled.load()) {
      s = grpc::Status(grpc::StatusCode::UNAVAILABLE,
                       absl::StrCat("sent no state for ",
                                    absl::FormatDuration(options_.stall_after),
                                    "; call cancelled"));
    }
    // The client has every response: a failure after the last one (the
    // replica died before closing the call) is no failure to it.
    if (s.ok() || (finished >= choices &&
                   s.error_code() == grpc::StatusCode::UNAVAILABLE)) {
      return grpc::Status::OK;
    }
    if (client_gone() || s.error_code() != grpc::StatusCode::UNAVAILABLE) {
      return Named(s, replicas_->address(r));
    }
    replicas_->counters(r).failures++;
    failed = r;
    const bool started = wrote || forward.resume_token_ids_size() >
                                      request.resume_token_ids_size();
    if (!started) {
      if (retried) return Named(s, replicas_->address(r));
      retried = true;
      ++retries_;
      continue;
    }
    // Mid-stream: the resume API continues it from the tokens sent.
    if (choices > 1 || resumed >= options_.max_resumes ||
        forward.resume_token_ids_size() >= max_tokens) {
      return Named(s, replicas_->address(r));
    }
    ++resumed;
    ++resumes_;
    forward.set_resume_position(forward.resume_token_ids_size());
    std::fprintf(stderr,
                 "[shardlm router] replica %s failed mid-stream (%s); "
                 "resuming after %d tokens\n",
                 replicas_->address(r).c_str(), s.error_message().c_str(),
                 forward.resume_token_ids_size());
  }
}

grpc::Status RouterService::Tokenize(grpc::ServerContext* context,
                                     const v1::TokenizeRequest* request,
                                     v1::TokenizeResponse* response) {
  if (grpc::Status s = CheckKey(*context); !s.ok()) return s;
  const int r = Choose({}, -1);
  if (r < 0) {
    return grpc::Status(
        grpc::StatusCode::UNAVAILABLE,
        absl::StrCat("no replica is ready: ", replicas_->Describe()));
  }
  std::unique_ptr<grpc::ClientContext> upstream = Upstream(context);
  // A unary call is not watched for stalls: it gets a deadline of its own
  // (the client's, when sooner, still applies).
  upstream->set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(30));
  const grpc::Status s =
      replicas_->stub(r).Tokenize(upstream.get(), *request, response);
  return s.ok() ? s : Named(s, replicas_->address(r));
}

grpc::Status RouterService::GetModelInfo(grpc::ServerContext* context,
                                         const v1::GetModelInfoRequest* request,
                                         v1::ModelInfo* response) {
  if (grpc::Status s = CheckKey(*context); !s.ok()) return s;
  const int r = Choose({}, -1);
  if (r < 0) {
    return grpc::Status(
        grpc::StatusCode::UNAVAILABLE,
        absl::StrCat("no replica is ready: ", replicas_->Describe()));
  }
  std::unique_ptr<grpc::ClientContext> upstream = Upstream(context);
  upstream->set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(30));
  const grpc::Status s =
      replicas_->stub(r).GetModelInfo(upstream.get(), *request, response);
  return s.ok() ? s : Named(s, replicas_->address(r));
}

std::string RouterService::Metrics() const {
  std::string out;
  const auto series = [&](const char* name, const char* type,
                          const char* help) {
    absl::StrAppend(&out, "# HELP ", name, " ", help, "\n# TYPE ", name, " ",
                    type, "\n");
  };
  series("shardlm_router_requests_total", "counter",
         "Generate, Tokenize and GetModelInfo calls sent to each replica");
  for (int i = 0; i < replicas_->size(); ++i) {
    absl::StrAppend(&out, "shardlm_router_requests_total{replica=\"",
                    replicas_->address(i), "\"} ",
                    replicas_->counters(i).requests.load(), "\n");
  }
  series("shardlm_router_predicted_prefix_blocks_total", "counter",
         "KV blocks kv routing predicted cached on the replica it chose");
  for (int i = 0; i < replicas_->size(); ++i) {
    absl::StrAppend(&out,
                    "shardlm_router_predicted_prefix_blocks_total{replica=\"",
                    replicas_->address(i), "\"} ",
                    replicas_->counters(i).predicted_hit_blocks.load(), "\n");
  }
  series("shardlm_router_replica_failures_total", "counter",
         "Generate calls that ended UNAVAILABLE on each replica");
  for (int i = 0; i < replicas_->size(); ++i) {
    absl::StrAppend(&out, "shardlm_router_replica_failures_total{replica=\"",
                    replicas_->address(i), "\"} ",
                    replicas_->counters(i).failures.load(), "\n");
  }
  series("shardlm_router_retries_total", "counter",
         "Requests retried on another replica after failing before their "
         "first response");
  absl::StrAppend(&out, "shardlm_router_retries_total ", retries_.load(), "\n");
  series("shardlm_router_resumes_total", "counter",
         "Streams resumed on another replica after failing mid-stream");
  absl::StrAppend(&out, "shardlm_router_resumes_total ", resumes_.load(), "\n");
  series("shardlm_router_unroutable_total", "counter",
         "Calls refused because no replica was ready");
  absl::StrAppend(&out, "shardlm_router_unroutable_total ", no_replica_.load(),
                  "\n");
  series("shardlm_router_replicas_ready", "gauge",
         "Replicas taking new requests");
  absl::StrAppend(&out, "shardlm_router_replicas_ready ",
                  replicas_->ready_count(), "\n");
  decision_seconds_.AppendPrometheus(out, "shardlm_router_decision_seconds",
                                     "Time to choose a replica (policy and "
                                     "prompt hashing, not tokenizing)");
  return out;
}

}  // namespace shardlm
