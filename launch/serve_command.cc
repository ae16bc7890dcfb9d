// shardlm serve: one process, no cluster. Runs the Engine in-process (TP x PP
// on threads when asked) behind the public gRPC API until SIGINT or SIGTERM.
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "api/api_server.h"
#include "engine/engine.h"
#include "launch/api_flags.h"
#include "launch/commands.h"
#include "launch/drain.h"
#include "launch/engine_flags.h"
#include "launch/flags.h"
#include "launch/remote_generate.h"
#include "model/tokenizer.h"
#include "model/weight_source.h"

namespace shardlm {
namespace {

struct ServeFlags {
  LocalEngineFlags engine;
  std::string listen = "127.0.0.1:50051";
  std::string http_listen;
  ApiFlags api;
};

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "shardlm serve: %s\n", std::string(s.message()).c_str());
  return 1;
}

}  // namespace

int ServeCommand(int argc, char** argv) {
  ServeFlags f;
  FlagSet flags(
      "usage: shardlm serve --model PATH [--listen HOST:PORT] [flags]\n"
      "Serves the shardlm.v1.Inference gRPC API (plus grpc.health.v1 and\n"
      "reflection) from a model in this process, until SIGINT or SIGTERM.\n"
      "Query it with `shardlm generate --server HOST:PORT --prompt TEXT`.");
  f.engine.Register(flags);
  flags.Add("listen", &f.listen, "address to listen on; port 0 picks one");
  flags.Add("http-listen", &f.http_listen,
            "address of the HTTP API (OpenAI-style /v1/completions, "
            "/v1/chat/completions, /v1/models; /metrics, /health, /ready); "
            "empty: none. Set SHARDLM_API_KEY to require a key on both APIs");
  f.api.Register(flags);
  if (absl::Status s = flags.Parse(argc, argv, 2); !s.ok()) {
    std::fprintf(stderr, "shardlm serve: %s\n\n%s",
                 std::string(s.message()).c_str(), flags.Usage().c_str());
    return 2;
  }
  if (flags.help()) {
    std::fputs(flags.Usage().c_str(), stdout);
    return 0;
  }
  std::string problem;
  if (f.engine.model.empty()) problem = "--model is required";
  if (problem.empty() && f.listen.empty()) problem = "--listen is empty";
  if (problem.empty() && !flags.positional().empty()) {
    problem = absl::StrCat("unexpected argument '", flags.positional()[0], "'");
  }
  if (problem.empty()) problem = f.engine.Problem();
  if (problem.empty()) problem = f.api.Problem();
  absl::StatusOr<TlsConfig> tls = f.api.LoadTls();
  if (problem.empty() && !tls.ok()) {
    problem = std::string(tls.status().message());
  }
  if (!problem.empty()) {
    std::fprintf(stderr, "shardlm serve: %s\n\n%s", problem.c_str(),
                 flags.Usage().c_str());
    return 2;
  }

  // SIGINT and SIGTERM are blocked in every thread (gRPC's included, which
  // inherit this mask) and taken by sigwait below.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  auto local = LoadLocalModel(f.engine);
  if (!local.ok()) return Fail(local.status());
  const std::string& name = local->name;
  const int tp = static_cast<int>(f.engine.tp);
  const int pp = static_cast<int>(f.engine.pp);
  // Filled field by field: gcc 12 misreports the strings of a designated
  // temporary as maybe-uninitialized.
  ApiServerOptions api;
  api.listen_address = f.listen;
  api.model_name = name;
  api.service.tp = tp;
  api.service.pp = pp;
  api.service.cp = static_cast<int>(f.engine.cp);
  api.service.api_key = ApiKeyFromEnv();
  f.api.Apply(api, *std::move(tls));
  api.http_listen_address = f.http_listen;
  auto server =
      ApiServer::Start(local->engine.get(), local->tokenizer.get(), api);
  if (!server.ok()) return Fail(server.status());
  // The host as given, the port as bound (they differ for port 0).
  const std::string host = f.listen.substr(0, f.listen.rfind(':'));
  std::fprintf(
      stderr, "[shardlm] serving %s (tp %d, pp %d%s) on %s:%d\n", name.c_str(),
      tp, pp, f.engine.cp > 1 ? absl::StrCat(", cp ", f.engine.cp).c_str() : "",
      host.c_str(), (*server)->port());
  if ((*server)->http_port() != 0) {
    std::fprintf(stderr, "[shardlm] HTTP API on %s:%d%s\n",
                 f.http_listen.substr(0, f.http_listen.rfind(':')).c_str(),
                 (*server)->http_port(),
                 ApiKeyFromEnv().empty() ? "" : " (API key required)");
  }

  int sig = 0;
  RouteStopSignalsHere();
  sigwait(&stop_signals, &sig);
  return DrainOnSignal(**server, sig, stop_signals,
                       absl::Seconds(f.api.drain_timeout_s), "server");
}

}  // namespace shardlm
