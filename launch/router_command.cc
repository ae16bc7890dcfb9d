// shardlm router: one endpoint in front of several replicas (clusters or
// `serve` processes) of the same model (DESIGN.md section 1; docs/
// router.md). Serves shardlm.v1.Inference, grpc.health.v1 and reflection
// over gRPC, and /health, /ready and /metrics over HTTP, until SIGINT or
// SIGTERM.
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/http_server.h"
#include "coordinator/inference_service.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/resource_quota.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "launch/commands.h"
#include "launch/drain.h"
#include "launch/flags.h"
#include "launch/remote_generate.h"
#include "model/tokenizer.h"
#include "router/replica_set.h"
#include "router/router_service.h"

namespace shardlm {
namespace {

struct RouterFlags {
  std::vector<std::string> replicas;
  std::string replicas_file;
  std::string listen = "127.0.0.1:50050";
  std::string http_listen;
  std::string policy = "kv";
  std::string model;
  double load_factor = 1.5;
  int64_t load_slack = 4;
  int64_t stale_after_ms = 1000;
  int64_t max_grpc_calls = 512;
};

// Addresses from a file: one per line; blank lines and #-comments skipped.
absl::StatusOr<std::vector<std::string>> ReadReplicasFile(
    const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("cannot read --replicas-file ", path));
  }
  std::vector<std::string> out;
  std::string line;
  while (std::getline(in, line)) {
    absl::string_view v = line;
    v = v.substr(0, v.find('#'));
    v = absl::StripAsciiWhitespace(v);
    if (!v.empty()) out.emplace_back(v);
  }
  return out;
}

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "shardlm router: %s\n",
               std::string(s.message()).c_str());
  return 1;
}

}  // namespace

int RouterCommand(int argc, char** argv) {
  RouterFlags f;
  FlagSet flags(
      "usage: shardlm router --replica HOST:PORT [--replica ...] "
      "[--listen HOST:PORT] [flags]\n"
      "One gRPC endpoint (shardlm.v1.Inference, health, reflection) in front\n"
      "of several replicas serving the same model: each Generate goes to the\n"
      "replica the policy picks; a request that fails before its first token\n"
      "is retried once elsewhere, one that fails mid-stream is resumed\n"
      "elsewhere with the same text. See docs/router.md.");
  flags.Add("replica", &f.replicas,
            "a replica's gRPC address (a coordinator or serve); repeatable");
  flags.Add("replicas-file", &f.replicas_file,
            "a file of replica addresses, one per line (# comments); "
            "re-read when it changes (looked at every second)");
  flags.Add("listen", &f.listen, "gRPC address to listen on; port 0 picks one");
  flags.Add("http-listen", &f.http_listen,
            "address of /health, /ready (200 while a replica is ready) and "
            "/metrics; empty: none");
  flags.Add("policy", &f.policy, "kv, least-load or round-robin");
  flags.Add("model", &f.model,
            "the replicas' model file or directory, for its tokenizer: kv "
            "routing hashes text prompts with it (without it, only "
            "prompt_token_ids are hashed)");
  flags.Add("load-factor", &f.load_factor,
            "kv: a replica is passed over while its sequences exceed "
            "load-factor x the least loaded's + load-slack");
  flags.Add("load-slack", &f.load_slack, "see --load-factor");
  flags.Add("stale-after-ms", &f.stale_after_ms,
            "a replica silent this long (no state update) takes no new "
            "requests");
  flags.Add("max-grpc-calls", &f.max_grpc_calls,
            "most gRPC calls handled at once (each holds a thread while it "
            "streams); beyond: RESOURCE_EXHAUSTED");
  if (absl::Status s = flags.Parse(argc, argv, 2); !s.ok()) {
    std::fprintf(stderr, "shardlm router: %s\n\n%s",
                 std::string(s.message()).c_str(), flags.Usage().c_str());
    return 2;
  }
  if (flags.help()) {
    std::fputs(flags.Usage().c_str(), stdout);
    return 0;
  }
  std::string problem;
  absl::StatusOr<RoutingPolicyKind> kind = ParseRoutingPolicy(f.policy);
  if (!kind.ok()) problem = std::string(kind.status().message());
  if (problem.empty() && !flags.positional().empty()) {
    problem = absl::StrCat("unexpected argument '", flags.positional()[0], "'");
  }
  const std::vector<std::string> flag_replicas = f.replicas;
  if (problem.empty() && !f.replicas_file.empty()) {
    auto more = ReadReplicasFile(f.replicas_file);
    if (!more.ok()) {
      problem = std::string(more.status().message());
    } else {
      f.replicas.insert(f.replicas.end(), more->begin(), more->end());
    }
  }
  if (problem.empty() && f.replicas.empty()) {
    problem = "give at least one --replica HOST:PORT (or --replicas-file)";
  }
  if (problem.empty() && f.listen.empty()) problem = "--listen is empty";
  if (problem.empty() && !(f.load_factor >= 1.0)) {
    problem = "--load-factor must be at least 1";
  }
  if (problem.empty() && f.load_slack < 0) {
    problem = "--load-slack must not be negative";
  }
  if (problem.empty() && (f.stale_after_ms < 300 || f.stale_after_ms > 60000)) {
    problem =
        "--stale-after-ms must be 300..60000 (replicas send state "
        "every 250 ms)";
  }
  if (problem.empty() && (f.max_grpc_calls < 1 || f.max_grpc_calls > 65536)) {
    problem = "--max-grpc-calls must be 1..65536";
  }
  if (!problem.empty()) {
    std::fprintf(stderr, "shardlm router: %s\n\n%s", problem.c_str(),
                 flags.Usage().c_str());
    return 2;
  }

  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  std::unique_ptr<Tokenizer> tokenizer;
  if (!f.model.empty()) {
    auto t = LoadTokenizer(f.model);
    if (!t.ok()) return Fail(t.status());
    tokenizer = *std::move(t);
  }
  const std::string api_key = ApiKeyFromEnv();
  ReplicaSetOptions set_options;
  set_options.addresses = f.replicas;
  set_options.api_key = api_key;
  set_options.stale_after = absl::Milliseconds(f.stale_after_ms);
  auto replicas = ReplicaSet::Start(std::move(set_options));
  if (!replicas.ok()) return Fail(replicas.status());

  RouterServiceOptions service_options;
  service_options.routing.kind = *kind;
  service_options.routing.load_factor = f.load_factor;
  service_options.routing.load_slack = f.load_slack;
  service_options.api_key = api_key;
  RouterService service(replicas->get(), tokenizer.get(), service_options);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(f.listen, grpc::InsecureServerCredentials(), &port);
  std::unique_ptr<grpc::Service> wire = RouterWireService(&service);
  builder.RegisterService(wire.get());
  // As on a replica: a burst of streams costs threads up to this cap, then
  // RESOURCE_EXHAUSTED; a few more keep health checks answering.
  grpc::ResourceQuota quota("shardlm-router");
  quota.SetMaxThreads(static_cast<int>(f.max_grpc_calls) + 8);
  builder.SetResourceQuota(quota);
  builder.SetMaxReceiveMessageSize(
      static_cast<int>(MaxGrpcRequestBytes(ServiceOptions().max_prompt_bytes)));
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    return Fail(absl::UnavailableError(
        absl::StrCat("cannot listen on ", f.listen,
                     " (malformed address, or the port is in use)")));
  }

  std::unique_ptr<HttpServer> http;
  if (!f.http_listen.empty()) {
    HttpServerOptions http_options;
    http_options.listen_address = f.http_listen;
    http_options.probe_paths = {"/health", "/ready"};
    ReplicaSet* set = replicas->get();
    auto started = HttpServer::Start(http_options, [set, &service](
                                                       const HttpRequest& req,
                                                       HttpResponse& res) {
      if (req.method != "GET") {
        res.Send(405, "text/plain", "GET only\n");
      } else if (req.path == "/health") {
        res.Send(200, "text/plain", "ok\n");
      } else if (req.path == "/ready") {
        const int n = set->ready_count();
        if (n > 0) {
          res.Send(200, "text/plain",
                   absl::StrCat(n, " of ", set->size(), " replicas ready\n"));
        } else {
          res.Send(
              503, "text/plain",
              absl::StrCat("no replica is ready: ", set->Describe(), "\n"));
        }
      } else if (req.path == "/metrics") {
        res.Send(200, "text/plain; version=0.0.4", service.Metrics());
      } else {
        res.Send(404, "text/plain",
                 "the router serves /health, /ready and /metrics over "
                 "HTTP; the OpenAI-style API is not routed yet (use "
                 "gRPC)\n");
      }
    });
    if (!started.ok()) return Fail(started.status());
    http = *std::move(started);
  }

  // Health: SERVING while a replica is ready, looked at every 100 ms.
  absl::Mutex mu;
  bool stopping = false;
  std::thread health([&] {
    grpc::HealthCheckServiceInterface* h = server->GetHealthCheckService();
    absl::MutexLock lock(&mu);
    while (!stopping) {
      const bool serving = (*replicas)->ready_count() > 0;
      if (h != nullptr) {
        h->SetServingStatus("", serving);
        h->SetServingStatus("shardlm.v1.Inference", serving);
      }
      mu.AwaitWithTimeout(absl::Condition(&stopping), absl::Milliseconds(100));
    }
  });

  // --replicas-file: re-read when its modification time or size changes.
  std::thread file_watcher;
  if (!f.replicas_file.empty()) {
    file_watcher = std::thread([&] {
      namespace fs = std::filesystem;
      const auto stamp = [&]() -> std::pair<fs::file_time_type, uintmax_t> {
        std::error_code ec;
        const auto t = fs::last_write_time(f.replicas_file, ec);
        const auto n = fs::file_size(f.replicas_file, ec);
        return {ec ? fs::file_time_type() : t, ec ? 0 : n};
      };
      auto seen = stamp();
      absl::MutexLock lock(&mu);
      while (
          !mu.AwaitWithTimeout(absl::Condition(&stopping), absl::Seconds(1))) {
        const auto now = stamp();
        if (now == seen) continue;
        seen = now;
        auto listed = ReadReplicasFile(f.replicas_file);
        if (!listed.ok()) {
          std::fprintf(stderr, "[shardlm router] %s; keeping the replicas\n",
                       std::string(listed.status().message()).c_str());
          continue;
        }
        std::vector<std::string> all = flag_replicas;
        all.insert(all.end(), listed->begin(), listed->end());
        if (absl::Status s = (*replicas)->SetAddresses(all); !s.ok()) {
          std::fprintf(stderr, "[shardlm router] %s\n",
                       std::string(s.message()).c_str());
        }
      }
    });
  }

  const std::string host = f.listen.substr(0, f.listen.rfind(':'));
  std::fprintf(stderr,
               "[shardlm] router (%s, %d replicas, model '%s') on %s:%d\n",
               f.policy.c_str(), (*replicas)->size(),
               (*replicas)->model().empty() ? "(none answered yet)"
                                            : (*replicas)->model().c_str(),
               host.c_str(), port);
  if (http != nullptr) {
    std::fprintf(stderr, "[shardlm] router HTTP on %s:%d\n",
                 f.http_listen.substr(0, f.http_listen.rfind(':')).c_str(),
                 http->port());
  }

  int sig = 0;
  RouteStopSignalsHere();
  sigwait(&stop_signals, &sig);
  std::fprintf(stderr, "[shardlm] router: signal %d, stopping\n", sig);
  {
    absl::MutexLock lock(&mu);
    stopping = true;
  }
  health.join();
  if (file_watcher.joinable()) file_watcher.join();
  if (http != nullptr) http->Shutdown();
  // A second of grace; then calls in flight are cancelled (and with them
  // their calls to the replicas).
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  return 0;
}

}  // namespace shardlm
