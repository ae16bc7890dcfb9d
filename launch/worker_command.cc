// shardlm worker: one worker rank started on its own (a Kubernetes pod, a
// process manager, a shell), joining a `shardlm coordinator`.
//
//   SHARDLM_CLUSTER_TOKEN=... shardlm worker --model PATH
//       --coordinator HOST:PORT --rank N
//
// The rank defaults to LWS_WORKER_INDEX (a LeaderWorkerSet's worker pods
// are 1..size-1, the leader 0), else SHARDLM_POD_INDEX + 1 (a StatefulSet
// of workers); the coordinator to $LWS_LEADER_ADDRESS:50052 (the port from
// SHARDLM_CONTROL_PORT when set). The worker dials the coordinator
// (retrying, and saying what it waits for, up to --join-timeout-s), takes
// its assignment, meets its TP, CP and PP peers over Gloo through the
// coordinator's rendezvous store, loads its shard and serves steps. It exits 0
// when the coordinator stops the cluster, and non-zero within seconds when the
// coordinator or a peer is lost.
#include <arpa/inet.h>
#include <netdb.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "backend/device.h"
#include "collectives/gloo_communicator.h"
#include "core/status.h"
#include "grpcpp/grpcpp.h"
#include "http/http_server.h"
#include "launch/commands.h"
#include "launch/control_tls_flags.h"
#include "launch/drain.h"
#include "launch/flags.h"
#include "launch/node_address.h"
#include "model/shard_plan.h"
#include "worker/control_store.h"
#include "worker/cuda_shard_host.h"
#include "worker/shard_host.h"
#include "worker/worker_agent.h"

namespace shardlm {
namespace {

constexpr char kDefaultControlPort[] = "50052";

struct WorkerFlags {
  std::string model;
  std::string coordinator;
  int64_t rank = -1;
  int64_t join_timeout_s = 300;
  std::string health_listen;
  std::string data_address;
  std::string data_interface;
  int64_t drain_timeout_s = 30;
  std::string device = "auto";
  std::string cuda_weights = "bf16";
  ControlTlsFlags control_tls;
};

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? "" : v;
}

// The rank from the environment a supervisor sets; -1 when none is set;
// -2 when one is set but is not a number.
int64_t RankFromEnv(std::string* source) {
  int64_t v = 0;
  if (std::string lws = Env("LWS_WORKER_INDEX"); !lws.empty()) {
    *source = absl::StrCat("LWS_WORKER_INDEX=", lws);
    return absl::SimpleAtoi(lws, &v) ? v : -2;
  }
  if (std::string pod = Env("SHARDLM_POD_INDEX"); !pod.empty()) {
    *source = absl::StrCat("SHARDLM_POD_INDEX=", pod, ", plus 1");
    return absl::SimpleAtoi(pod, &v) && v >= 0 ? v + 1 : -2;
  }
  return -1;
}

// An IPv4 address of `host` ("" when it does not resolve to one).
std::string ResolveIpv4(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0) return "";
  char buf[INET_ADDRSTRLEN] = {};
  inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(found->ai_addr)->sin_addr,
            buf, sizeof(buf));
  freeaddrinfo(found);
  return buf;
}

// The Gloo side of a shard: listen on the chosen address, meet the TP
// group, then the PP chain, through the coordinator's store.
ConnectShard GlooConnector(const WorkerFlags& f, int rank,
                           const std::string& token) {
  return [f, rank, token](
             const WorkerAssignment& a) -> absl::StatusOr<ShardCommunicators> {
    const RankPlace place{
        .tp_rank = a.tp_rank, .cp_rank = a.cp_rank, .pp_rank = a.pp_rank};
    if (RankIndex(place, a.tp, a.cp) != rank - 1) {
      return absl::InternalError(
          absl::StrCat("rank ", rank, " was assigned tp ", a.tp_rank, " pp ",
                       a.pp_rank, " cp ", a.cp_rank));
    }
    std::string interface = f.data_interface;
    if (interface.empty()) interface = Env("GLOO_SOCKET_IFNAME");
    std::string host = f.data_address;
    if (host.empty() && interface.empty()) {
      // The address this host would use to reach the coordinator: the
      // network the peers share with it.
      const std::string coordinator_host =
          f.coordinator.substr(0, f.coordinator.rfind(':'));
      host = KernelRouteSource(ResolveIpv4(coordinator_host));
      if (host.empty()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "cannot tell which local address reaches the coordinator at ",
            f.coordinator, "; set --data-address or GLOO_SOCKET_IFNAME"));
      }
    }
    ASSIGN_OR_RETURN(std::shared_ptr<GlooTransport> transport,
                     GlooTransport::Create(host, interface));
    std::fprintf(stderr, "[shardlm] worker rank %d: data plane on %s\n", rank,
                 transport->description().c_str());
    ControlPlaneStore store(
        NewControlChannel(f.coordinator, f.control_tls.loaded,
                          grpc::ChannelArguments()),
        f.coordinator, token);
    const CommOptions options{.timeout = absl::Seconds(f.join_timeout_s)};
    // The groups and their names as every launcher makes them
    // (ShardGroups); each peer labelled by its rank and place.
    const auto label = [&](int index) {
      const RankPlace q = PlaceOfRank(index, a.tp, a.cp);
      return absl::StrCat(
          "rank ", 1 + index, " (stage ", q.pp_rank, ", tp ", q.tp_rank,
          a.cp > 1 ? absl::StrCat(", cp ", q.cp_rank) : "", ")");
    };
    ShardCommunicators comms;
    for (const ShardGroup& g : ShardGroups(place, a.tp, a.cp, a.pp)) {
      std::vector<std::string> labels;
      for (int member : g.members) labels.push_back(label(member));
      ASSIGN_OR_RETURN(
          std::unique_ptr<Communicator> c,
          GlooCommunicator::Connect(store, a.rendezvous_prefix, transport,
                                    g.name, g.rank, g.size(), options, labels));
      switch (g.kind) {
        case GroupKind::kTp:
          comms.tp = std::move(c);
          break;
        case GroupKind::kCp:
          comms.cp = std::move(c);
          break;
        case GroupKind::kPp:
          comms.pp = std::move(c);
          break;
      }
    }
    return comms;
  };
}

[[noreturn]] void Exit(int code) {
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(code);
}

void RegisterWorkerFlags(FlagSet& flags, WorkerFlags& f) {
  flags.Add("model", &f.model,
            "GGUF file or safetensors directory (the same bytes as every "
            "other rank's)");
  flags.Add("coordinator", &f.coordinator,
            "the coordinator's control address; default: "
            "$LWS_LEADER_ADDRESS:$SHARDLM_CONTROL_PORT (port 50052 when "
            "unset)");
  flags.Add("rank", &f.rank,
            "worker rank, 1..tp*pp*cp (rank-1 = (stage*cp + cp index)*tp + "
            "tp index; cp 1: stage (rank-1)/tp, tp index (rank-1)%tp); "
            "default: $LWS_WORKER_INDEX, else $SHARDLM_POD_INDEX + 1");
  flags.Add("join-timeout-s", &f.join_timeout_s,
            "how long to wait for the coordinator and the peers (DNS, "
            "connection, rendezvous)");
  flags.Add("health-listen", &f.health_listen,
            "address of this worker's HTTP probes: /health (the process "
            "serves) and /ready (joined and loaded); empty: none");
  flags.Add("data-address", &f.data_address,
            "local address the data plane (Gloo) listens on; default: the "
            "address that routes to the coordinator");
  flags.Add("data-interface", &f.data_interface,
            "network interface for the data plane instead (default: "
            "$GLOO_SOCKET_IFNAME)");
  flags.Add("device", &f.device,
            "auto (cuda:0 when this binary has CUDA and a GPU is visible, "
            "else cpu), cpu, cuda (GPU 0) or cuda:N; the coordinator's "
            "--device must match. GPU workers exchange activations over "
            "NCCL, CPU workers over Gloo");
  flags.Add("cuda-weights", &f.cuda_weights, kCudaWeightsHelp);
  flags.Add("drain-timeout-s", &f.drain_timeout_s,
            "on SIGTERM, how long to wait for the coordinator to drain and "
            "stop the cluster before leaving");
  f.control_tls.Register(flags);
  f.control_tls.RegisterServerName(flags);
}

// Fills what the environment gives (the rank, the coordinator's address)
// and says what is wrong with the flags, or "" when nothing is.
std::string CompleteWorkerFlags(WorkerFlags& f, std::string& rank_source,
                                const std::string& token) {
  if (f.rank == -1) f.rank = RankFromEnv(&rank_source);
  if (f.coordinator.empty() && !Env("LWS_LEADER_ADDRESS").empty()) {
    const std::string port = Env("SHARDLM_CONTROL_PORT");
    f.coordinator = absl::StrCat(Env("LWS_LEADER_ADDRESS"), ":",
                                 port.empty() ? kDefaultControlPort : port);
  }
  if (f.model.empty()) return "--model is required";
  if (f.coordinator.empty()) {
    return "--coordinator is required (or LWS_LEADER_ADDRESS)";
  }
  if (f.coordinator.rfind(':') == std::string::npos) {
    return absl::StrCat("--coordinator '", f.coordinator,
                        "' must be HOST:PORT");
  }
  if (f.rank == -1) {
    return "--rank is required (or LWS_WORKER_INDEX, or SHARDLM_POD_INDEX)";
  }
  if (f.rank < 1) {
    return absl::StrCat(rank_source, " gives rank ", f.rank,
                        "; worker ranks start at 1 (rank 0 is the "
                        "coordinator)");
  }
  if (token.empty()) {
    return "SHARDLM_CLUSTER_TOKEN is not set; it must hold the secret the "
           "coordinator has";
  }
  if (f.join_timeout_s < 1 || f.drain_timeout_s < 0) {
    return "--join-timeout-s must be >= 1, --drain-timeout-s >= 0";
  }
  if (absl::Status tls = f.control_tls.Load(); !tls.ok()) {
    return std::string(tls.message());
  }
  return "";
}

// The device this worker runs on (--device, this binary, the machine) and,
// on a GPU, its UUID. InvalidArgument for a device it cannot have.
struct WorkerDevice {
  DeviceChoice choice;
  std::string gpu_uuid;
  bool on_gpu() const { return choice.kind == DeviceKind::kCuda; }
};
absl::StatusOr<WorkerDevice> ChooseWorkerDevice(const std::string& flag) {
  const absl::StatusOr<DeviceRequest> parsed = ParseDeviceFlag(flag);
  absl::StatusOr<DeviceChoice> choice =
      parsed.ok() ? ChooseDevice(*parsed, QueryCuda())
                  : absl::StatusOr<DeviceChoice>(parsed.status());
  if (!choice.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--device: ", choice.status().message()));
  }
  WorkerDevice d{.choice = *choice};
  if (d.on_gpu() && !GpuWorkersBuilt()) {
    if (!parsed->automatic) {
      return absl::InvalidArgumentError(
          absl::StrCat("--device ", flag,
                       ": this shardlm has no GPU workers (built without "
                       "NCCL)"));
    }
    d.choice = DeviceChoice{.kind = DeviceKind::kCpu,
                            .reason =
                                "device auto: the CPU, since this "
                                "shardlm has no GPU workers (no NCCL)"};
  }
  if (d.on_gpu()) {
    absl::StatusOr<std::string> uuid = GpuUuid(d.choice.ordinal);
    if (!uuid.ok()) return absl::InternalError(uuid.status().message());
    d.gpu_uuid = *uuid;
  }
  return d;
}

// The shard of the current formation; replaced when the cluster re-forms
// (the probes read it under the mutex).
struct CurrentHost {
  absl::Mutex mu;
  std::unique_ptr<ShardHost> host ABSL_GUARDED_BY(mu);
};

// /health (the process serves) and /ready (joined and loaded) on `listen`.
absl::StatusOr<std::unique_ptr<HttpServer>> StartProbes(
    const std::string& listen, CurrentHost& current) {
  HttpServerOptions options;
  options.listen_address = listen;
  options.max_connections = 16;
  options.probe_paths = {"/health", "/ready"};
  return HttpServer::Start(
      options, [&current](const HttpRequest& req, HttpResponse& res) {
        if (req.path == "/health") {
          res.Send(200, "text/plain", "ok\n");
        } else if (req.path == "/ready") {
          absl::MutexLock lock(&current.mu);
          if (current.host != nullptr && current.host->loaded()) {
            res.Send(200, "text/plain", "ready\n");
          } else {
            res.Send(503, "text/plain", "joining or loading\n");
          }
        } else {
          res.Send(404, "text/plain", "not found\n");
        }
      });
}

// A new formation's shard: on the GPU (its NCCL ids meet in `store`), or
// on the CPU over Gloo. Exits 1 when the GPU host cannot be made.
std::unique_ptr<ShardHost> NewShardHost(const WorkerFlags& f, int rank,
                                        const std::string& token,
                                        const WorkerDevice& device,
                                        const CudaWeights& cuda_weights,
                                        const WeightSource* source,
                                        ControlPlaneStore& store) {
  if (device.on_gpu()) {
    absl::StatusOr<std::unique_ptr<ShardHost>> gpu =
        NewCudaShardHost(source, {.device = device.choice.ordinal,
                                  .rank = rank,
                                  .store = &store,
                                  .timeout = absl::Seconds(f.join_timeout_s),
                                  .cuda_weights = cuda_weights});
    if (!gpu.ok()) {
      std::fprintf(stderr, "shardlm worker (rank %d): %s\n", rank,
                   std::string(gpu.status().message()).c_str());
      Exit(1);
    }
    return *std::move(gpu);
  }
  return std::make_unique<CommShardHost>(source, GlooConnector(f, rank, token));
}

// What the worker registers with and how its agent behaves.
WorkerAgentOptions AgentOptions(const WorkerFlags& f, int rank,
                                const std::string& token,
                                const WorkerDevice& device,
                                uint64_t model_bytes, const std::string& digest,
                                const absl::Notification* stop) {
  return {.coordinator = f.coordinator,
          .rank = rank,
          .model_path = f.model,
          .model_bytes = model_bytes,
          .model_digest = digest,
          .cluster_token = token,
          .device = device.on_gpu() ? "cuda" : "cpu",
          .gpu_uuid = device.gpu_uuid,
          .gpu_ordinal = device.choice.ordinal,
          .connect_timeout = absl::Seconds(f.join_timeout_s),
          .on_abandon =
              [](const std::string& why) {
                std::fprintf(stderr, "shardlm worker (%s)\n", why.c_str());
                Exit(1);
              },
          .stop = stop,
          .tls = f.control_tls.loaded};
}

// Serves formation after formation, each on a new shard host, until the
// agent ends otherwise than for a re-formation (or a stop signal came);
// the agent's last status.
absl::Status ServeFormations(
    const std::function<std::unique_ptr<ShardHost>()>& new_host,
    const WorkerAgentOptions& agent, CurrentHost& current,
    const absl::Notification& stop) {
  absl::Status s;
  while (true) {
    ShardHost* host = nullptr;
    {
      absl::MutexLock lock(&current.mu);
      current.host.reset();  // The last formation's shard and data plane.
      current.host = new_host();
      host = current.host.get();
    }
    s = RunWorkerAgent(agent, *host);
    if (!absl::IsAborted(s) || stop.HasBeenNotified()) break;
    // The cluster re-forms (coordinator --rejoin): register again.
    std::fprintf(stderr, "[shardlm] worker rank %d: %s; rejoining\n",
                 agent.rank, std::string(s.message()).c_str());
  }
  return s;
}

}  // namespace

int WorkerCommand(int argc, char** argv) {
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  WorkerFlags f;
  FlagSet flags(
      "usage: SHARDLM_CLUSTER_TOKEN=SECRET shardlm worker --model PATH "
      "[--coordinator HOST:PORT] [--rank N] [flags]\n"
      "One worker rank of a cluster that `shardlm coordinator` leads; the\n"
      "coordinator assigns its shard. SHARDLM_CLUSTER_TOKEN must match the\n"
      "coordinator's.");
  RegisterWorkerFlags(flags, f);
  if (absl::Status s = flags.Parse(argc, argv, 2); !s.ok()) {
    std::fprintf(stderr, "shardlm worker: %s\n\n%s",
                 std::string(s.message()).c_str(), flags.Usage().c_str());
    return 2;
  }
  if (flags.help()) {
    std::fputs(flags.Usage().c_str(), stdout);
    return 0;
  }
  const std::string token = Env("SHARDLM_CLUSTER_TOKEN");
  std::string rank_source = "--rank";
  if (const std::string problem = CompleteWorkerFlags(f, rank_source, token);
      !problem.empty()) {
    std::fprintf(stderr, "shardlm worker: %s\n", problem.c_str());
    return 2;
  }
  const int rank = static_cast<int>(f.rank);
  const absl::StatusOr<CudaWeights> cuda_weights =
      ParseCudaWeights(f.cuda_weights);
  if (!cuda_weights.ok()) {
    std::fprintf(stderr, "shardlm worker: %s\n",
                 std::string(cuda_weights.status().message()).c_str());
    return 2;
  }
  absl::StatusOr<WorkerDevice> device = ChooseWorkerDevice(f.device);
  if (!device.ok()) {
    std::fprintf(stderr, "shardlm worker (rank %d): %s\n", rank,
                 std::string(device.status().message()).c_str());
    return absl::IsInvalidArgument(device.status()) ? 2 : 1;
  }
  const bool on_gpu = device->on_gpu();
  std::fprintf(stderr, "[shardlm] worker rank %d: %s%s%s\n", rank,
               device->choice.reason.c_str(), on_gpu ? " " : "",
               device->gpu_uuid.c_str());

  auto source = OpenWeights(f.model);
  uint64_t model_bytes = 0;
  auto digest = source.ok() ? ModelDigest(f.model, &model_bytes)
                            : absl::StatusOr<std::string>(source.status());
  if (!digest.ok()) {
    std::fprintf(stderr, "shardlm worker (rank %d): %s\n", rank,
                 std::string(digest.status().message()).c_str());
    return 1;
  }
  // GPU workers' NCCL ids meet in the coordinator's store (it outlives
  // every shard).
  ControlPlaneStore store(NewControlChannel(f.coordinator, f.control_tls.loaded,
                                            grpc::ChannelArguments()),
                          f.coordinator, token);
  CurrentHost current;
  std::unique_ptr<HttpServer> probes;
  if (!f.health_listen.empty()) {
    absl::StatusOr<std::unique_ptr<HttpServer>> server =
        StartProbes(f.health_listen, current);
    if (!server.ok()) {
      std::fprintf(stderr, "shardlm worker (rank %d): --health-listen: %s\n",
                   rank, std::string(server.status().message()).c_str());
      return 1;
    }
    probes = *std::move(server);
  }
  std::fprintf(stderr,
               "[shardlm] worker rank %d (%s): joining the coordinator at %s\n",
               rank, rank_source.c_str(), f.coordinator.c_str());

  absl::Notification stop;  // See NotifyWorkerStopOnSignal.
  NotifyWorkerStopOnSignal(stop_signals, absl::Seconds(f.drain_timeout_s),
                           &stop);
  const absl::Status s = ServeFormations(
      [&] {
        return NewShardHost(f, rank, token, *device, *cuda_weights,
                            source->get(), store);
      },
      AgentOptions(f, rank, token, *device, model_bytes, *digest, &stop),
      current, stop);
  if (s.ok() || absl::IsCancelled(s)) Exit(0);
  std::fprintf(stderr, "shardlm worker (rank %d): %s\n", rank,
               std::string(s.message()).c_str());
  Exit(1);
}

}  // namespace shardlm
