// shardlm serve: one process, no cluster. Runs the Engine in-process (TP x PP
// on threads when asked) behind the public gRPC API until SIGINT or SIGTERM.
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "coordinator/engine.h"
#include "coordinator/inference_service.h"
#include "launch/commands.h"
#include "launch/flags.h"
#include "model/tokenizer.h"
#include "model/weight_source.h"

namespace shardlm {
namespace {

struct ServeFlags {
  std::string model;
  std::string listen = "127.0.0.1:50051";
  int64_t threads = 0;
  int64_t kv_cache_bytes = 0;
  int64_t max_batched_tokens = 512;
  int64_t tp = 1;
  int64_t pp = 1;
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
  flags.Add("model", &f.model,
            "GGUF file, or directory with config.json + "
            "*.safetensors + tokenizer.json");
  flags.Add("listen", &f.listen, "address to listen on; port 0 picks one");
  flags.Add("threads", &f.threads, "CPU threads, 0 = all cores");
  flags.Add("kv-cache-bytes", &f.kv_cache_bytes,
            "KV cache budget, 0 = one full context");
  flags.Add("max-batched-tokens", &f.max_batched_tokens,
            "tokens per step; longer prompts prefill in chunks");
  flags.Add("tp", &f.tp, "tensor-parallel shards (run on threads here)");
  flags.Add("pp", &f.pp, "pipeline stages (run on threads here)");
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
  if (f.model.empty()) problem = "--model is required";
  if (problem.empty() && f.listen.empty()) problem = "--listen is empty";
  if (problem.empty() && !flags.positional().empty()) {
    problem = absl::StrCat("unexpected argument '", flags.positional()[0], "'");
  }
  if (problem.empty() &&
      (f.max_batched_tokens < 1 || f.max_batched_tokens > (1 << 20))) {
    problem = "--max-batched-tokens must be in [1, 1048576]";
  }
  if (problem.empty() && (f.tp < 1 || f.tp > 64 || f.pp < 1 || f.pp > 64)) {
    problem = "--tp and --pp must be in [1, 64]";
  }
  if (problem.empty() && (f.threads < 0 || f.threads > 4096)) {
    problem = "--threads must be in [0, 4096]";
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

  auto source = OpenWeights(f.model);
  if (!source.ok()) return Fail(source.status());
  auto tokenizer = LoadTokenizer(f.model);
  if (!tokenizer.ok()) return Fail(tokenizer.status());
  auto engine = Engine::Create(
      **source,
      {.kv_cache_bytes = f.kv_cache_bytes,
       .max_batched_tokens = static_cast<int32_t>(f.max_batched_tokens),
       .threads = static_cast<int>(f.threads),
       .tp = static_cast<int>(f.tp),
       .pp = static_cast<int>(f.pp)});
  if (!engine.ok()) return Fail(engine.status());
  source->reset();  // Weights are loaded; release the mapping.

  std::string name = (*engine)->config().name;
  if (name.empty()) name = std::filesystem::path(f.model).filename().string();
  auto server = ApiServer::Start(engine->get(), tokenizer->get(),
                                 {.listen_address = f.listen,
                                  .model_name = name,
                                  .service = {.tp = static_cast<int>(f.tp),
                                              .pp = static_cast<int>(f.pp)}});
  if (!server.ok()) return Fail(server.status());
  // The host as given, the port as bound (they differ for port 0).
  const std::string host = f.listen.substr(0, f.listen.rfind(':'));
  std::fprintf(stderr, "[shardlm] serving %s (tp %d, pp %d) on %s:%d\n",
               name.c_str(), static_cast<int>(f.tp), static_cast<int>(f.pp),
               host.c_str(), (*server)->port());

  int sig = 0;
  sigwait(&stop_signals, &sig);
  std::fprintf(stderr, "[shardlm] %s: shutting down\n",
               sig == SIGINT ? "SIGINT" : "SIGTERM");
  (*server)->Shutdown();
  return 0;
}

}  // namespace shardlm
