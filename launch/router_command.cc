// shardlm router: one endpoint in front of several replicas (clusters or
// `serve` processes) of the same model (DESIGN.md section 1; docs/
// router.md). Serves shardlm.v1.Inference, grpc.health.v1 and reflection
// over gRPC, and the OpenAI-style API, /health, /ready and /metrics over
// HTTP, until SIGINT or SIGTERM.
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "api/api_server.h"
#include "api/inference_service.h"
#include "core/status.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/resource_quota.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "http/http_server.h"
#include "http/memory_budget.h"
#include "http/tls.h"
#include "launch/commands.h"
#include "launch/drain.h"
#include "launch/flags.h"
#include "launch/remote_generate.h"
#include "model/tokenizer.h"
#include "router/replica_dns.h"
#include "router/replica_set.h"
#include "router/router_http.h"
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
  int64_t drain_timeout_s = 30;
  std::string replicas_dns;
  int64_t dns_interval_ms = 5000;
  int64_t dns_wait_s = 30;
  // The router's own ports (as a coordinator's), and its calls to replicas.
  std::string tls_cert, tls_key, tls_client_ca;
  std::string replica_tls_ca, replica_tls_cert, replica_tls_key;
  int64_t request_memory_mb = 0;
  int64_t idle_thread_timeout_s = 10;
  bool metrics_auth = false;
};

// Channel credentials for the calls to the replicas: TLS when
// --replica-tls-ca is given (mutual with --replica-tls-cert/-key).
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ReplicaCredentials(
    const RouterFlags& f) {
  if (f.replica_tls_ca.empty()) {
    if (!f.replica_tls_cert.empty() || !f.replica_tls_key.empty()) {
      return absl::InvalidArgumentError(
          "--replica-tls-cert and --replica-tls-key need --replica-tls-ca "
          "(the replicas' CA)");
    }
    return grpc::InsecureChannelCredentials();
  }
  if (f.replica_tls_cert.empty() != f.replica_tls_key.empty()) {
    return absl::InvalidArgumentError(
        "--replica-tls-cert and --replica-tls-key go together: give both or "
        "neither");
  }
  grpc::SslCredentialsOptions ssl;
  ASSIGN_OR_RETURN(ssl.pem_root_certs,
                   ReadPemFile(f.replica_tls_ca, "--replica-tls-ca"));
  if (!f.replica_tls_cert.empty()) {
    ASSIGN_OR_RETURN(ssl.pem_cert_chain,
                     ReadPemFile(f.replica_tls_cert, "--replica-tls-cert"));
    ASSIGN_OR_RETURN(ssl.pem_private_key,
                     ReadPemFile(f.replica_tls_key, "--replica-tls-key"));
    RETURN_IF_ERROR(CheckKeyPair(ssl.pem_cert_chain, ssl.pem_private_key,
                                 "--replica-tls-cert " + f.replica_tls_cert,
                                 "--replica-tls-key " + f.replica_tls_key));
  }
  RETURN_IF_ERROR(CheckCertificates(ssl.pem_root_certs,
                                    "--replica-tls-ca " + f.replica_tls_ca));
  return grpc::SslCredentials(ssl);
}

// Addresses from a file: one per line; blank lines and #-comments skipped.
// When a file was last written, and its size (zero on an error): what the
// --replicas-file watcher compares to see a change.
using FileStamp = std::pair<std::filesystem::file_time_type, uintmax_t>;
FileStamp StampOf(const std::string& path) {
  std::error_code ec;
  const auto t = std::filesystem::last_write_time(path, ec);
  const auto n = std::filesystem::file_size(path, ec);
  return {ec ? std::filesystem::file_time_type() : t, ec ? 0 : n};
}

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

void RegisterRouterFlags(FlagSet& flags, RouterFlags& f) {
  flags.Add("replica", &f.replicas,
            "a replica's gRPC address (a coordinator or serve); repeatable");
  flags.Add("replicas-file", &f.replicas_file,
            "a file of replica addresses, one per line (# comments); "
            "re-read when it changes (looked at every second)");
  flags.Add("listen", &f.listen, "gRPC address to listen on; port 0 picks one");
  flags.Add("drain-timeout-s", &f.drain_timeout_s,
            "on SIGTERM/SIGINT, how long requests in flight may take to "
            "finish (new ones are refused, /ready says 503) before they are "
            "cancelled; a second signal stops at once");
  flags.Add("replicas-dns", &f.replicas_dns,
            "NAME:PORT: every address NAME resolves to is a replica on PORT "
            "(a LeaderWorkerSet's leader headless service); re-resolved "
            "every --dns-interval-ms, replicas added and removed as the "
            "records change");
  flags.Add("dns-interval-ms", &f.dns_interval_ms,
            "how often --replicas-dns is resolved again");
  flags.Add("dns-wait-s", &f.dns_wait_s,
            "at startup, how long --replicas-dns may fail to resolve "
            "(retried every second) before the router gives up");
  flags.Add("http-listen", &f.http_listen,
            "address of the OpenAI-style API (/v1/completions, "
            "/v1/chat/completions, /v1/models), /health, /ready (200 while "
            "a replica is ready) and /metrics; empty: none");
  flags.Add("tls-cert", &f.tls_cert,
            "PEM certificate (chain) of the router's gRPC and HTTP ports: "
            "both serve TLS only (with --tls-key)");
  flags.Add("tls-key", &f.tls_key, "PEM private key of --tls-cert");
  flags.Add("tls-client-ca", &f.tls_client_ca,
            "PEM CA for mutual TLS: clients must present a certificate it "
            "signed");
  flags.Add("replica-tls-ca", &f.replica_tls_ca,
            "PEM CA that signed the replicas' certificates: call them over "
            "TLS");
  flags.Add("replica-tls-cert", &f.replica_tls_cert,
            "PEM client certificate for replicas that require mutual TLS "
            "(with --replica-tls-key and --replica-tls-ca)");
  flags.Add("replica-tls-key", &f.replica_tls_key,
            "PEM private key of --replica-tls-cert");
  flags.Add("request-memory-mb", &f.request_memory_mb,
            "MiB that requests in flight may cost the router (HTTP bodies "
            "and their parse, gRPC requests); past it a request waits "
            "250 ms, then gets 429 / RESOURCE_EXHAUSTED. 0: an eighth of "
            "the machine's (or cgroup's) memory, within 256 MiB..16 GiB");
  flags.Add("idle-thread-timeout-s", &f.idle_thread_timeout_s,
            "HTTP pool threads above the base (4) exit after this many "
            "seconds without work");
  flags.Add("metrics-auth", &f.metrics_auth,
            "/metrics needs the API key (SHARDLM_API_KEY) too");
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
}

// What the router runs on beyond the flags' values, found while checking
// them.
struct RouterInputs {
  RoutingPolicyKind kind = RoutingPolicyKind::kKv;
  std::vector<std::string> flag_replicas;  // --replica's, without the file's.
  FileStamp file_read_at;                  // --replicas-file's, when read.
  std::optional<DnsTarget> dns;            // --replicas-dns.
};

// The first numeric (or empty) flag out of its range, or "".
std::string RangeProblem(const RouterFlags& f) {
  if (f.drain_timeout_s < 0 || f.drain_timeout_s > 86400) {
    return "--drain-timeout-s must be 0..86400";
  }
  if (f.dns_interval_ms < 100 || f.dns_interval_ms > 3600000) {
    return "--dns-interval-ms must be 100..3600000";
  }
  if (f.dns_wait_s < 0 || f.dns_wait_s > 3600) {
    return "--dns-wait-s must be 0..3600";
  }
  if (f.request_memory_mb < 0 || f.request_memory_mb > (int64_t{1} << 30)) {
    return "--request-memory-mb must be in [0, 2^30] (0: the default)";
  }
  if (f.idle_thread_timeout_s < 1 || f.idle_thread_timeout_s > 86400) {
    return "--idle-thread-timeout-s must be in [1, 86400]";
  }
  if (f.listen.empty()) return "--listen is empty";
  if (!(f.load_factor >= 1.0)) return "--load-factor must be at least 1";
  if (f.load_slack < 0) return "--load-slack must not be negative";
  if (f.stale_after_ms < 300 || f.stale_after_ms > 60000) {
    return "--stale-after-ms must be 300..60000 (replicas send state "
           "every 250 ms)";
  }
  if (f.max_grpc_calls < 1 || f.max_grpc_calls > 65536) {
    return "--max-grpc-calls must be 1..65536";
  }
  return "";
}

// The first problem with the flags ("" if none), checked in order. Reads
// --replicas-file into f.replicas and fills `*in`.
std::string RouterProblem(RouterFlags& f, const FlagSet& flags,
                          RouterInputs* in) {
  std::string problem;
  absl::StatusOr<RoutingPolicyKind> kind = ParseRoutingPolicy(f.policy);
  if (!kind.ok()) problem = std::string(kind.status().message());
  if (kind.ok()) in->kind = *kind;
  if (problem.empty() && !flags.positional().empty()) {
    problem = absl::StrCat("unexpected argument '", flags.positional()[0], "'");
  }
  in->flag_replicas = f.replicas;
  // Stamped before the first read, so that a write landing between it and
  // the watcher's start is seen (stamped in the watcher, such a write was
  // missed until the next one).
  in->file_read_at =
      f.replicas_file.empty() ? FileStamp() : StampOf(f.replicas_file);
  if (problem.empty() && !f.replicas_file.empty()) {
    auto more = ReadReplicasFile(f.replicas_file);
    if (!more.ok()) {
      problem = std::string(more.status().message());
    } else {
      f.replicas.insert(f.replicas.end(), more->begin(), more->end());
    }
  }
  if (problem.empty() && !f.replicas_dns.empty()) {
    absl::StatusOr<DnsTarget> t = ParseDnsTarget(f.replicas_dns);
    if (t.ok()) {
      in->dns = *t;
    } else {
      problem = std::string(t.status().message());
    }
  }
  if (problem.empty() && f.replicas.empty() && !in->dns.has_value()) {
    problem =
        "give at least one --replica HOST:PORT (or --replicas-file, or "
        "--replicas-dns NAME:PORT)";
  }
  if (problem.empty()) problem = RangeProblem(f);
  return problem;
}

// Waits up to --dns-wait-s for --replicas-dns's first answer (retried
// every second) and adds it to `sources`. An exit code when the router
// should stop instead: the name did not resolve, or a stop signal came.
std::optional<int> WaitForDnsReplicas(const RouterFlags& f,
                                      const DnsTarget& dns,
                                      const sigset_t& stop_signals,
                                      ReplicaSources& sources) {
  const absl::Time give_up = absl::Now() + absl::Seconds(f.dns_wait_s);
  while (true) {
    absl::StatusOr<std::vector<std::string>> found =
        DnsReplicaAddresses(dns, ResolveHost);
    if (found.ok()) {
      sources.Set(ReplicaSources::kDns, *found);
      std::fprintf(stderr, "[shardlm router] --replicas-dns %s: %zu replicas\n",
                   f.replicas_dns.c_str(), found->size());
      return std::nullopt;
    }
    if (absl::Now() >= give_up) {
      return Fail(absl::NotFoundError(absl::StrCat(
          "--replicas-dns ", f.replicas_dns, ": ", found.status().message(),
          " (for ", f.dns_wait_s, " s)")));
    }
    std::fprintf(stderr, "[shardlm router] --replicas-dns %s: %s; retrying\n",
                 f.replicas_dns.c_str(),
                 std::string(found.status().message()).c_str());
    // A second, or a stop signal (nothing to drain yet: exit at once).
    const timespec second = {1, 0};
    if (sigtimedwait(&stop_signals, nullptr, &second) > 0) {
      std::fprintf(stderr,
                   "[shardlm] router: stopped while waiting for "
                   "--replicas-dns\n");
      return 0;
    }
  }
}

// The gRPC port: the router's service, health and reflection. `*port` is
// 0 when it could not listen.
std::unique_ptr<grpc::Server> StartRouterGrpc(const RouterFlags& f,
                                              const TlsConfig& tls,
                                              grpc::Service* wire, int* port) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(f.listen, GrpcServerCredentials(tls), port);
  builder.RegisterService(wire);
  // As on a replica: a burst of streams costs threads up to this cap, then
  // RESOURCE_EXHAUSTED; a few more keep health checks answering.
  grpc::ResourceQuota quota("shardlm-router");
  quota.SetMaxThreads(static_cast<int>(f.max_grpc_calls) + 8);
  builder.SetResourceQuota(quota);
  builder.SetMaxReceiveMessageSize(
      static_cast<int>(MaxGrpcRequestBytes(ServiceOptions().max_prompt_bytes)));
  return builder.BuildAndStart();
}

// The HTTP port, with --http-listen (else none: nullptr).
absl::StatusOr<std::unique_ptr<HttpServer>> StartRouterHttp(
    const RouterFlags& f, const TlsConfig& tls, MemoryBudget* budget,
    RouterHttpApi* api) {
  if (f.http_listen.empty()) return std::unique_ptr<HttpServer>();
  HttpServerOptions http_options;
  http_options.listen_address = f.http_listen;
  http_options.tls = tls;
  http_options.memory_budget = budget;
  http_options.idle_thread_timeout =
      std::chrono::seconds(f.idle_thread_timeout_s);
  return StartApiHttp(api, std::move(http_options));
}

// Health: SERVING while a replica is ready, looked at every 100 ms, until
// `stopping` (under `mu`).
void ReportHealth(grpc::Server& server, const ReplicaSet& replicas,
                  const RouterService& service, absl::Mutex& mu,
                  const bool& stopping) {
  grpc::HealthCheckServiceInterface* h = server.GetHealthCheckService();
  absl::MutexLock lock(&mu);
  while (!stopping) {
    const bool serving = replicas.ready_count() > 0 && !service.draining();
    if (h != nullptr) {
      h->SetServingStatus("", serving);
      h->SetServingStatus("shardlm.v1.Inference", serving);
    }
    mu.AwaitWithTimeout(absl::Condition(&stopping), absl::Milliseconds(100));
  }
}

// --replicas-file: re-read when its modification time or size changes
// (looked at every second); --replicas-dns: resolved again every
// --dns-interval-ms. Either change hands the union to the set. Runs until
// `stopping` (under `mu`).
void WatchReplicaSources(const RouterFlags& f,
                         const std::optional<DnsTarget>& dns,
                         FileStamp file_read_at, ReplicaSources& sources,
                         ReplicaSet& replicas, absl::Mutex& mu,
                         const bool& stopping) {
  FileStamp seen = file_read_at;
  const absl::Duration dns_every = absl::Milliseconds(f.dns_interval_ms);
  absl::Time next_dns = absl::Now() + dns_every;
  std::string last_dns_problem;
  const absl::Duration tick = std::min(
      absl::Seconds(1), dns.has_value() ? dns_every : absl::Seconds(1));
  absl::MutexLock lock(&mu);
  while (!mu.AwaitWithTimeout(absl::Condition(&stopping), tick)) {
    bool changed = false;
    const FileStamp now =
        f.replicas_file.empty() ? FileStamp() : StampOf(f.replicas_file);
    if (!f.replicas_file.empty() && now != seen) {
      seen = now;
      auto listed = ReadReplicasFile(f.replicas_file);
      if (!listed.ok()) {
        std::fprintf(stderr, "[shardlm router] %s; keeping the replicas\n",
                     std::string(listed.status().message()).c_str());
      } else {
        changed |= sources.Set(ReplicaSources::kFile, *std::move(listed));
      }
    }
    if (dns.has_value() && absl::Now() >= next_dns) {
      next_dns = absl::Now() + dns_every;
      auto found = DnsReplicaAddresses(*dns, ResolveHost);
      if (!found.ok()) {
        // A name that stops resolving (every leader gone, or DNS down)
        // keeps the replicas it had: their own state says whether
        // they take requests.
        const std::string why(found.status().message());
        if (why != last_dns_problem) {
          std::fprintf(stderr,
                       "[shardlm router] --replicas-dns %s: %s; keeping "
                       "the replicas\n",
                       f.replicas_dns.c_str(), why.c_str());
          last_dns_problem = why;
        }
      } else {
        last_dns_problem.clear();
        changed |= sources.Set(ReplicaSources::kDns, *std::move(found));
      }
    }
    if (!changed) continue;
    if (absl::Status s = replicas.SetAddresses(sources.All()); !s.ok()) {
      std::fprintf(stderr, "[shardlm router] %s\n",
                   std::string(s.message()).c_str());
    }
  }
}

// Drain: not ready at once, new requests refused, those in flight run
// on for up to --drain-timeout-s (a second signal cuts it short). Whether
// a second signal came.
bool Drain(const RouterFlags& f, int sig, const sigset_t& stop_signals,
           RouterService& service) {
  std::fprintf(stderr,
               "[shardlm] router: %s: draining (up to %lld s; new requests "
               "are refused; a second signal stops at once)\n",
               sig == SIGINT ? "SIGINT" : "SIGTERM",
               static_cast<long long>(f.drain_timeout_s));
  service.StartDraining();  // The health thread sees it within 100 ms.
  const absl::Time drain_end = absl::Now() + absl::Seconds(f.drain_timeout_s);
  bool second = false;
  while (service.in_flight() > 0 && absl::Now() < drain_end && !second) {
    const timespec pace = {0, 50'000'000};
    second = sigtimedwait(&stop_signals, nullptr, &pace) > 0;
  }
  const int64_t left = service.in_flight();
  std::fprintf(stderr, "[shardlm] router: %s; stopping\n",
               left == 0 ? "drained"
               : second  ? "second signal, cancelling the calls left"
                         : "drain timeout, cancelling the calls left");
  return second;
}

// Serves on the gRPC (and HTTP) port until a stop signal, then drains;
// the exit code.
int ServeRouter(const RouterFlags& f, const RouterInputs& in,
                const TlsConfig& tls, const std::string& api_key,
                ReplicaSources& sources, ReplicaSet& replicas,
                RouterService& service, const sigset_t& stop_signals) {
  // What requests in flight may cost, as on a replica.
  MemoryBudget budget(f.request_memory_mb > 0
                          ? f.request_memory_mb << 20
                          : MemoryBudget::DefaultLimitBytes());
  std::unique_ptr<grpc::Service> wire = RouterWireService(&service, &budget);
  int port = 0;
  std::unique_ptr<grpc::Server> server =
      StartRouterGrpc(f, tls, wire.get(), &port);
  if (server == nullptr || port == 0) {
    return Fail(absl::UnavailableError(
        absl::StrCat("cannot listen on ", f.listen,
                     " (malformed address, or the port is in use)")));
  }

  std::unique_ptr<HttpServer> http;
  RouterHttpApi http_api(&replicas, &service,
                         RouterHttpOptions{.api_key = api_key,
                                           .metrics_auth = f.metrics_auth,
                                           .memory_budget = &budget});
  auto started = StartRouterHttp(f, tls, &budget, &http_api);
  if (!started.ok()) return Fail(started.status());
  http = *std::move(started);

  absl::Mutex mu;
  bool stopping = false;
  std::thread health(
      [&] { ReportHealth(*server, replicas, service, mu, stopping); });
  std::thread source_watcher;
  if (!f.replicas_file.empty() || in.dns.has_value()) {
    source_watcher = std::thread([&] {
      WatchReplicaSources(f, in.dns, in.file_read_at, sources, replicas, mu,
                          stopping);
    });
  }

  const std::string host = f.listen.substr(0, f.listen.rfind(':'));
  std::fprintf(stderr,
               "[shardlm] router (%s, %d replicas, model '%s') on %s:%d\n",
               f.policy.c_str(), replicas.size(),
               replicas.model().empty() ? "(none answered yet)"
                                        : replicas.model().c_str(),
               host.c_str(), port);
  if (http != nullptr) {
    std::fprintf(stderr, "[shardlm] router HTTP on %s:%d\n",
                 f.http_listen.substr(0, f.http_listen.rfind(':')).c_str(),
                 http->port());
  }

  int sig = 0;
  RouteStopSignalsHere();
  sigwait(&stop_signals, &sig);
  const bool second = Drain(f, sig, stop_signals, service);
  {
    absl::MutexLock lock(&mu);
    stopping = true;
  }
  health.join();
  if (source_watcher.joinable()) source_watcher.join();
  if (http != nullptr) http->Shutdown();
  // A second of grace; then calls in flight are cancelled (and with them
  // their calls to the replicas).
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  return second ? 1 : 0;
}

}  // namespace

int RouterCommand(int argc, char** argv) {
  RouterFlags f;
  FlagSet flags(
      "usage: shardlm router (--replica HOST:PORT ... | --replicas-file FILE "
      "|\n"
      "    --replicas-dns NAME:PORT) [--listen HOST:PORT] [--http-listen "
      "HOST:PORT] [flags]\n"
      "One gRPC endpoint (shardlm.v1.Inference, health, reflection) and one\n"
      "OpenAI-style HTTP endpoint in front of several replicas serving the\n"
      "same model: each request goes to the\n"
      "replica the policy picks; a request that fails before its first token\n"
      "is retried once elsewhere, one that fails mid-stream is resumed\n"
      "elsewhere with the same text. See docs/router.md.");
  RegisterRouterFlags(flags, f);
  if (absl::Status s = flags.Parse(argc, argv, 2); !s.ok()) {
    std::fprintf(stderr, "shardlm router: %s\n\n%s",
                 std::string(s.message()).c_str(), flags.Usage().c_str());
    return 2;
  }
  if (flags.help()) {
    std::fputs(flags.Usage().c_str(), stdout);
    return 0;
  }
  RouterInputs in;
  if (const std::string problem = RouterProblem(f, flags, &in);
      !problem.empty()) {
    std::fprintf(stderr, "shardlm router: %s\n\n%s", problem.c_str(),
                 flags.Usage().c_str());
    return 2;
  }

  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  absl::StatusOr<TlsConfig> tls =
      LoadTlsConfig(f.tls_cert, f.tls_key, f.tls_client_ca);
  if (!tls.ok()) return Fail(tls.status());
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> replica_creds =
      ReplicaCredentials(f);
  if (!replica_creds.ok()) return Fail(replica_creds.status());
  const std::string api_key = ApiKeyFromEnv();
  if (f.metrics_auth && api_key.empty()) {
    return Fail(absl::InvalidArgumentError(
        "--metrics-auth needs an API key (set SHARDLM_API_KEY)"));
  }

  // The replica list's sources; with DNS, its first answer is waited for.
  ReplicaSources sources(in.flag_replicas);
  std::vector<std::string> file_replicas(
      f.replicas.begin() + in.flag_replicas.size(), f.replicas.end());
  sources.Set(ReplicaSources::kFile, file_replicas);
  if (in.dns.has_value()) {
    if (std::optional<int> code =
            WaitForDnsReplicas(f, *in.dns, stop_signals, sources)) {
      return *code;
    }
  }

  std::unique_ptr<Tokenizer> tokenizer;
  if (!f.model.empty()) {
    auto t = LoadTokenizer(f.model);
    if (!t.ok()) return Fail(t.status());
    tokenizer = *std::move(t);
  }
  ReplicaSetOptions set_options;
  set_options.addresses = sources.All();
  set_options.api_key = api_key;
  set_options.credentials = *replica_creds;
  set_options.stale_after = absl::Milliseconds(f.stale_after_ms);
  auto replicas = ReplicaSet::Start(std::move(set_options));
  if (!replicas.ok()) return Fail(replicas.status());

  RouterServiceOptions service_options;
  service_options.routing.kind = in.kind;
  service_options.routing.load_factor = f.load_factor;
  service_options.routing.load_slack = f.load_slack;
  service_options.api_key = api_key;
  RouterService service(replicas->get(), tokenizer.get(), service_options);

  return ServeRouter(f, in, *tls, api_key, sources, **replicas, service,
                     stop_signals);
}

}  // namespace shardlm
