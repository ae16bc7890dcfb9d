// shardlm coordinator: the leader of a cluster whose workers start on their
// own (`shardlm worker`: Kubernetes pods, a process manager, a shell),
// without mpirun.
//
//   SHARDLM_CLUSTER_TOKEN=... shardlm coordinator --model PATH --tp T
//       --pp P [--cp C] --listen H:P [--http-listen H:P] --control-listen H:P
//
// It reads only the model's config and tokenizer, waits for workers
// 1..T*P*C to register on the control plane and load, then serves the public
// API. Workers exchange activations over Gloo, meeting through the rendezvous
// store of the control plane. When a rank is lost (killed, hung in a step
// for --step-timeout-s, or silent) the coordinator turns not-ready, fails
// requests with UNAVAILABLE naming the rank, tells the other workers to
// leave, and exits 1, so that a supervisor restarts the group
// (LeaderWorkerSet's RecreateGroupOnPodRestart). SIGTERM drains.
#include <pthread.h>
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "cluster/control_service.h"
#include "core/secret.h"
#include "core/status.h"
#include "grpcpp/grpcpp.h"
#include "launch/cluster_serving.h"
#include "launch/commands.h"
#include "launch/flags.h"
#include "model/shard_plan.h"

namespace shardlm {
namespace {

// The coordinator's own flags, beside the cluster's (ClusterFlags).
struct CoordinatorFlags {
  std::string control_listen = "0.0.0.0:50052";
  double failure_grace_s = 3;
  bool rejoin = false;
  int64_t rejoin_timeout_s = 120;
};

void RegisterCoordinatorFlags(FlagSet& flags, ClusterFlags& f,
                              CoordinatorFlags& c) {
  f.Register(flags,
             "GGUF file or safetensors directory (config and tokenizer "
             "are read here; the workers load the weights)");
  flags.Add("control-listen", &c.control_listen,
            "address the control plane listens on for workers");
  flags.Add("failure-grace-s", &c.failure_grace_s,
            "after a rank is lost: how long to stay up, not ready, "
            "answering UNAVAILABLE, before exiting 1");
  flags.Add("rejoin", &c.rejoin,
            "after a rank is lost: stay up (not ready), wait up to "
            "--rejoin-timeout-s for a worker with that rank to come back, "
            "re-form with the survivors and resume every request where it "
            "was (recomputed: streams pause, then continue unchanged), "
            "instead of exiting");
  flags.Add("rejoin-timeout-s", &c.rejoin_timeout_s,
            "with --rejoin: how long to wait for a lost rank's replacement "
            "before the paused requests fail (UNAVAILABLE naming the rank) "
            "and the coordinator exits 1");
}

// The first problem with the flags and the token ("" if none); loads the
// control plane's TLS files when all else is right.
std::string CoordinatorProblem(ClusterFlags& f, const CoordinatorFlags& c,
                               const std::string& token) {
  std::string problem = f.Problem();
  if (problem.empty() && token.size() < 16) {
    problem =
        "SHARDLM_CLUSTER_TOKEN must hold a secret of at least 16 characters, "
        "shared with the workers (e.g. openssl rand -hex 32)";
  } else if (problem.empty() &&
             c.control_listen.rfind(':') == std::string::npos) {
    problem = "--control-listen must be HOST:PORT";
  } else if (problem.empty() &&
             (c.failure_grace_s < 0 || c.failure_grace_s > 600)) {
    problem = "--failure-grace-s must be in [0, 600]";
  } else if (problem.empty() &&
             (c.rejoin_timeout_s < 1 || c.rejoin_timeout_s > 86400)) {
    problem = "--rejoin-timeout-s must be in [1, 86400]";
  } else if (absl::Status s = f.control_tls.Load();
             problem.empty() && !s.ok()) {
    problem = std::string(s.message());
  }
  return problem;
}

// Whether the model can be served as the flags ask on `device`: context
// parallelism, the shard plan and the KV cache type.
absl::Status CheckLayout(const ClusterFlags& f, const WeightSource& source,
                         const std::string& device) {
  RETURN_IF_ERROR(
      CheckContextParallel(source.config(), static_cast<int>(f.cp)));
  if (auto plan = PlanShards(source, static_cast<int>(f.tp),
                             static_cast<int>(f.pp), f.MoeShardingOf());
      !plan.ok()) {
    return plan.status();
  }
  if (absl::StatusOr<DType> kv = f.KvDType(device); !kv.ok()) {
    return kv.status();
  }
  return absl::OkStatus();
}

// The control plane the workers dial, on --control-listen (`*port`: the
// port it got; 0 when it could not listen).
std::unique_ptr<grpc::Server> StartControlPlane(const ClusterFlags& f,
                                                const CoordinatorFlags& c,
                                                ControlService& service,
                                                int* port) {
  grpc::ServerBuilder builder;
  builder.AddListeningPort(
      c.control_listen, ControlServerCredentials(f.control_tls.loaded), port);
  AddControlService(builder, &service);
  return builder.BuildAndStart();
}

}  // namespace

int CoordinatorCommand(int argc, char** argv) {
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  ClusterFlags f;
  CoordinatorFlags c;
  FlagSet flags(
      "usage: SHARDLM_CLUSTER_TOKEN=SECRET shardlm coordinator --model PATH "
      "--tp TP --pp PP [--cp CP] [flags]\n"
      "Leads TP*PP*CP `shardlm worker` processes (ranks 1..TP*PP*CP) that "
      "dial\n"
      "--control-listen with the same SHARDLM_CLUSTER_TOKEN, and serves the\n"
      "API on --listen (and --http-listen).");
  RegisterCoordinatorFlags(flags, f, c);
  if (absl::Status s = flags.Parse(argc, argv, 2); !s.ok()) {
    std::fprintf(stderr, "shardlm coordinator: %s\n\n%s",
                 std::string(s.message()).c_str(), flags.Usage().c_str());
    return 2;
  }
  if (flags.help()) {
    std::fputs(flags.Usage().c_str(), stdout);
    return 0;
  }
  const char* env_token = std::getenv("SHARDLM_CLUSTER_TOKEN");
  const std::string token = env_token == nullptr ? "" : env_token;
  if (const std::string problem = CoordinatorProblem(f, c, token);
      !problem.empty()) {
    std::fprintf(stderr, "shardlm coordinator: %s\n", problem.c_str());
    return 2;
  }
  auto source = OpenWeights(f.model);
  if (!source.ok()) {
    std::fprintf(stderr, "shardlm coordinator: %s\n",
                 std::string(source.status().message()).c_str());
    return 1;
  }
  // The coordinator sees no worker's GPU: "auto" means CPU workers, and
  // GPU workers need --device cuda (a worker of the other kind is refused
  // at registration, saying so).
  const std::string device = f.device == "cuda" ? "cuda" : "cpu";
  if (absl::Status s = CheckLayout(f, **source, device); !s.ok()) {
    std::fprintf(stderr, "shardlm coordinator: %s\n",
                 std::string(s.message()).c_str());
    return 2;
  }
  ClusterOptions options = f.Control(token, device);
  options.rejoin = c.rejoin;
  // Rendezvous keys of this run only: workers of an earlier coordinator
  // never meet these.
  auto run_id = RandomHexToken(8);
  options.rendezvous_prefix = absl::StrCat("run-", run_id.ok() ? *run_id : "0");
  ControlService service(options);
  int control_port = 0;
  std::unique_ptr<grpc::Server> control =
      StartControlPlane(f, c, service, &control_port);
  if (control == nullptr || control_port == 0) {
    std::fprintf(stderr,
                 "shardlm coordinator: cannot listen for workers on %s "
                 "(malformed address, or the port is in use)\n",
                 c.control_listen.c_str());
    return 1;
  }
  const std::string address =
      absl::StrCat(c.control_listen.substr(0, c.control_listen.rfind(':')), ":",
                   control_port);
  std::fprintf(stderr,
               "[shardlm] coordinator: waiting up to %llds for %lld workers "
               "(tp %lld x pp %lld%s) on %s\n",
               static_cast<long long>(f.startup_timeout_s),
               static_cast<long long>(f.tp * f.pp * f.cp),
               static_cast<long long>(f.tp), static_cast<long long>(f.pp),
               f.cp > 1 ? absl::StrCat(" x cp ", f.cp).c_str() : "",
               address.c_str());
  const int code =
      ServeCluster(f,
                   {.command = "coordinator",
                    .workers_dial = address,
                    .exit_when_cluster_fails = !c.rejoin,
                    .failure_grace = absl::Seconds(c.failure_grace_s),
                    .rejoin = c.rejoin,
                    .rejoin_timeout = absl::Seconds(c.rejoin_timeout_s)},
                   **source, service, *control, stop_signals);
  std::fflush(stderr);
  std::_Exit(code);
}

}  // namespace shardlm
