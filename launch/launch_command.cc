// shardlm launch: the whole cluster from one mpirun (DESIGN.md section 1).
//
//   mpirun --enable-recovery -np 1+TP*PP*CP shardlm launch --model PATH
//       --tp TP --pp PP [--cp CP] --listen HOST:PORT
//
// Rank 0 becomes the coordinator (no weights: config and tokenizer only);
// ranks 1..TP*PP*CP become workers, worker r serving stage (r-1)/(TP*CP),
// CP index ((r-1)/TP)%CP, TP index (r-1)%TP (CP 1: stage (r-1)/TP). Every rank
// first checks what it can (flags, world size, model file, shard plan); if any
// rank fails, rank 0 prints every rank's reason and all exit. Then the
// coordinator's control address reaches the workers by MPI broadcast, the
// workers connect over gRPC, load their shards and exchange activations over
// MPI, and the coordinator serves the public API.
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "api/inference_service.h"
#include "backend/device.h"
#include "cluster/control_service.h"
#include "cluster/remote_executor.h"
#include "collectives/mpi_communicator.h"
#include "core/secret.h"
#include "core/status.h"
#include "engine/engine.h"
#include "grpcpp/grpcpp.h"
#include "launch/api_flags.h"
#include "launch/cluster_serving.h"
#include "launch/commands.h"
#include "launch/drain.h"
#include "launch/flags.h"
#include "launch/node_address.h"
#include "launch/remote_generate.h"
#include "model/shard_plan.h"
#include "model/tokenizer.h"
#include "worker/control_store.h"
#include "worker/cuda_shard_host.h"
#include "worker/shard_host.h"
#include "worker/worker_agent.h"

namespace shardlm {
namespace {

struct LaunchFlags : ClusterFlags {
  std::string control_listen;  // Empty: the advertised address (below).
  int64_t control_port = 0;
  std::string advertise_address;      // Empty: ChooseAdvertisedAddress.
  std::string cuda_weights = "bf16";  // GPU workers' uploads.
};

// Fixed-size text exchanged between ranks (MPI moves bytes).
constexpr int64_t kMessageInts = 128;  // 512 bytes.

Tensor PackText(const std::string& text, int64_t ints = kMessageInts) {
  Tensor t = *Tensor::Host(DType::kI32, {ints});
  std::memcpy(t.raw(), text.data(),
              std::min<size_t>(text.size(), ints * 4 - 1));
  return t;
}

std::string UnpackText(const void* data, int64_t ints = kMessageInts) {
  const char* c = static_cast<const char*>(data);
  return std::string(c, strnlen(c, ints * 4 - 1));
}

std::string Hostname() {
  char buf[256] = {};
  gethostname(buf, sizeof(buf) - 1);
  return buf;
}

// Every rank contributes "" (fine) or its reason; all ranks learn whether
// anyone failed, and rank 0 prints the reasons. Returns false on failure.
bool AgreeAllOk(MpiCommunicator& world, const std::string& mine) {
  Tensor send = PackText(mine);
  Tensor all = *Tensor::Host(DType::kI32, {world.size() * kMessageInts});
  if (absl::Status s = world.AllGather(send, all); !s.ok()) {
    std::fprintf(stderr, "shardlm launch (rank %d): %s\n", world.rank(),
                 std::string(s.message()).c_str());
    return false;
  }
  // Ranks that failed for the same reason are named together.
  std::vector<std::pair<std::string, std::vector<int>>> reasons;
  for (int r = 0; r < world.size(); ++r) {
    const std::string reason =
        UnpackText(all.data<int32_t>() + r * kMessageInts);
    if (reason.empty()) continue;
    auto it = std::find_if(reasons.begin(), reasons.end(),
                           [&](const auto& e) { return e.first == reason; });
    if (it == reasons.end()) {
      reasons.push_back({reason, {r}});
    } else {
      it->second.push_back(r);
    }
  }
  if (world.rank() == 0 && !reasons.empty()) {
    std::fprintf(stderr, "shardlm launch: cannot start:\n");
    for (const auto& [reason, ranks] : reasons) {
      std::fprintf(stderr, "  %s %s: %s\n",
                   ranks.size() == 1 ? "rank" : "ranks",
                   absl::StrJoin(ranks, ", ").c_str(), reason.c_str());
    }
  }
  return reasons.empty();
}

// Ends the process without MPI_Finalize (which waits for every rank, dead
// ones included).
[[noreturn]] void Exit(int code) {
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(code);
}

// Every rank's node, index r for rank r (collective: every rank calls it).
absl::StatusOr<std::vector<NodeInfo>> GatherNodes(MpiCommunicator& world) {
  constexpr int64_t kNodeInts = 512;  // 2 KiB of text per rank.
  NodeInfo self = ThisNode();
  std::string text = EncodeNodeInfo(self);
  while (text.size() >= kNodeInts * 4 && !self.interfaces.empty()) {
    self.interfaces.pop_back();  // Dozens of interfaces: keep the first.
    text = EncodeNodeInfo(self);
  }
  Tensor all = *Tensor::Host(DType::kI32, {world.size() * kNodeInts});
  RETURN_IF_ERROR(world.AllGather(PackText(text, kNodeInts), all));
  std::vector<NodeInfo> nodes;
  for (int r = 0; r < world.size(); ++r) {
    absl::StatusOr<NodeInfo> node = DecodeNodeInfo(
        UnpackText(all.data<int32_t>() + r * kNodeInts, kNodeInts));
    if (!node.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", r, ": ", node.status().message()));
    }
    nodes.push_back(*std::move(node));
  }
  return nodes;
}

// One line per host: which ranks it holds.
void PrintPlacement(const std::vector<NodeInfo>& nodes, int tp, int cp) {
  std::vector<bool> printed(nodes.size());
  for (size_t r = 0; r < nodes.size(); ++r) {
    if (printed[r]) continue;
    std::vector<std::string> ranks;
    for (size_t q = r; q < nodes.size(); ++q) {
      if (nodes[q].stack != nodes[r].stack) continue;
      printed[q] = true;
      if (q == 0) {
        ranks.push_back("0 (coordinator)");
        continue;
      }
      const RankPlace place = PlaceOfRank(static_cast<int>(q) - 1, tp, cp);
      ranks.push_back(absl::StrCat(
          q, " (stage ", place.pp_rank, ", tp ", place.tp_rank,
          cp > 1 ? absl::StrCat(", cp ", place.cp_rank) : "", ")"));
    }
    const std::string address = FirstAddress(nodes[r]);
    std::fprintf(stderr, "[shardlm] host %s%s%s: %s %s\n",
                 nodes[r].hostname.c_str(), address.empty() ? "" : " ",
                 address.c_str(), ranks.size() == 1 ? "rank" : "ranks",
                 absl::StrJoin(ranks, ", ").c_str());
  }
}

// Where a worker runs its shard: "cpu", or "cuda:N" for the GPU its place
// among the workers on its host gives (local index % visible GPUs); or
// the reason it cannot run as asked ("!reason").
std::string ResolveWorkerDevice(const LaunchFlags& f,
                                const std::vector<NodeInfo>& nodes, int rank) {
  int local = 0;  // Workers before this one on its host.
  for (int q = 1; q < rank; ++q) local += nodes[q].stack == nodes[rank].stack;
  const CudaAvailability cuda = QueryCuda();
  if (f.device == "cpu") return "cpu";
  if (f.device == "auto") {
    // As generate/serve: the CPU when the configuration asks for what GPU
    // workers lack (context parallelism is CPU-only so far).
    if (!GpuWorkersBuilt() || cuda.devices == 0 || f.cp > 1 ||
        (f.kv.kv_cache_dtype != "auto" && f.kv.kv_cache_dtype != "bf16")) {
      return "cpu";
    }
  } else if (!GpuWorkersBuilt()) {
    return "!--device cuda: this shardlm has no GPU workers (built without "
           "CUDA or without NCCL)";
  } else if (cuda.devices == 0) {
    return absl::StrCat("!--device cuda: ", cuda.why_none);
  }
  return absl::StrCat("cuda:", local % cuda.devices);
}

// Every rank's device choice (collective); rank 0 (the coordinator) gives
// "". Returns the workers' kind ("cpu" or "cuda"): with --device auto,
// "cuda" only when every worker sees a GPU, else "cpu" for all; or "" when
// they cannot run as asked (rank 0 has said why).
std::string AgreeOnDevice(MpiCommunicator& world, const std::string& mine,
                          const LaunchFlags& f) {
  Tensor all = *Tensor::Host(DType::kI32, {world.size() * kMessageInts});
  if (absl::Status s = world.AllGather(PackText(mine), all); !s.ok()) {
    std::fprintf(stderr, "shardlm launch (rank %d): %s\n", world.rank(),
                 std::string(s.message()).c_str());
    return "";
  }
  std::vector<int> on_cpu, on_cuda;
  std::vector<std::string> problems;
  for (int r = 1; r < world.size(); ++r) {
    const std::string d = UnpackText(all.data<int32_t>() + r * kMessageInts);
    if (!d.empty() && d[0] == '!') {
      problems.push_back(absl::StrCat("rank ", r, ": ", d.substr(1)));
    }
    (d == "cpu" ? on_cpu : on_cuda).push_back(r);
  }
  const bool root = world.rank() == 0;
  if (!problems.empty()) {
    if (root) {
      std::fprintf(stderr, "shardlm launch: cannot start:\n  %s\n",
                   absl::StrJoin(problems, "\n  ").c_str());
    }
    return "";
  }
  if (!on_cpu.empty() && !on_cuda.empty()) {
    // Workers of one cluster run on one kind of device: auto falls back to
    // CPUs for all (saying so); only cpu or cuda reach here otherwise.
    if (root) {
      std::fprintf(stderr,
                   "[shardlm] --device auto: ranks %s see a GPU but ranks %s "
                   "do not (or cannot use one): every worker runs on the "
                   "CPU\n",
                   absl::StrJoin(on_cuda, ", ").c_str(),
                   absl::StrJoin(on_cpu, ", ").c_str());
    }
    return "cpu";
  }
  return on_cuda.empty() ? "cpu" : "cuda";
}

// Where the control plane listens and the address workers dial (host part;
// the port is the one bound). Empty listen: no usable address (said why).
struct ControlAddress {
  std::string listen, advertise, why;
};

ControlAddress ChooseControlAddress(const LaunchFlags& f,
                                    const std::vector<NodeInfo>& nodes) {
  const std::string port = absl::StrCat(f.control_port);
  std::string listen_host;
  if (!f.control_listen.empty()) {
    listen_host = f.control_listen.substr(0, f.control_listen.rfind(':'));
  }
  const bool wildcard =
      listen_host.empty() || listen_host == "0.0.0.0" || listen_host == "[::]";
  ControlAddress out;
  if (!f.advertise_address.empty()) {
    out.advertise = f.advertise_address;
    out.why = "--advertise-address";
    out.listen = f.control_listen.empty() ? absl::StrCat("0.0.0.0:", port)
                                          : f.control_listen;
    return out;
  }
  if (!wildcard) {  // --control-listen on one address: dial that.
    out.advertise = listen_host;
    out.why = "--control-listen";
    out.listen = f.control_listen;
    return out;
  }
  const std::vector<NodeInfo> workers(nodes.begin() + 1, nodes.end());
  absl::StatusOr<AdvertisedAddress> chosen =
      ChooseAdvertisedAddress(nodes[0], workers);
  if (!chosen.ok()) {
    std::fprintf(stderr, "shardlm launch: %s\n",
                 std::string(chosen.status().message()).c_str());
    return out;
  }
  out.advertise = chosen->host;
  out.why = chosen->why;
  // Listen on that address only, unless --control-listen asked for all.
  out.listen = f.control_listen.empty() ? absl::StrCat(chosen->host, ":", port)
                                        : f.control_listen;
  return out;
}

int RunCoordinator(MpiCommunicator& world, const LaunchFlags& f,
                   const WeightSource& source, const sigset_t& stop_signals,
                   const std::vector<NodeInfo>& nodes,
                   const std::string& device) {
  // The cluster token: from the environment (so that a restarted rank can
  // rejoin), else fresh for this launch; it reaches the workers by MPI
  // broadcast with the control address.
  std::string token;
  if (const char* env = std::getenv("SHARDLM_CLUSTER_TOKEN");
      env != nullptr && *env != '\0') {
    token = env;
  } else if (auto t = RandomHexToken(); t.ok()) {
    token = *t;
  } else {
    std::fprintf(stderr, "shardlm launch: %s\n",
                 std::string(t.status().message()).c_str());
  }
  PrintPlacement(nodes, static_cast<int>(f.tp), static_cast<int>(f.cp));
  std::fprintf(stderr, "[shardlm] workers run on %s (--device %s)\n",
               device == "cuda" ? "GPUs" : "CPUs", f.device.c_str());
  const ControlAddress control_address = ChooseControlAddress(f, nodes);
  const std::string& listen = control_address.listen;
  ControlService service(f.Control(token, device));
  grpc::ServerBuilder builder;
  int control_port = 0;
  builder.AddListeningPort(
      listen, ControlServerCredentials(f.control_tls.loaded), &control_port);
  AddControlService(builder, &service);
  std::unique_ptr<grpc::Server> control =
      token.empty() || listen.empty() ? nullptr : builder.BuildAndStart();
  std::string address;
  if (listen.empty()) {
    // ChooseControlAddress said why.
  } else if (control == nullptr || control_port == 0) {
    std::fprintf(stderr,
                 "shardlm launch: cannot listen for workers on %s (malformed "
                 "address, or the port is in use)\n",
                 listen.c_str());
  } else {
    address = absl::StrCat(control_address.advertise, ":", control_port);
    std::fprintf(stderr, "[shardlm] workers dial %s (%s)\n", address.c_str(),
                 control_address.why.c_str());
  }
  // Workers learn the address and the token (empty: give up) by broadcast.
  Tensor packed = PackText(address.empty() ? "" : address + " " + token);
  if (absl::Status s = world.Broadcast(packed, 0); !s.ok() || address.empty()) {
    if (!s.ok())
      std::fprintf(stderr, "shardlm launch: %s\n",
                   std::string(s.message()).c_str());
    return 1;
  }

  return ServeCluster(f,
                      {.command = "launch",
                       .workers_dial = address,
                       .exit_when_cluster_fails = false},
                      source, service, *control, stop_signals);
}

// What a worker's steps cost, and CP's traffic, when it ran any.
void PrintRunnerStats(int rank, const ShardHost& host) {
  const std::optional<RunnerStats> st = host.stats();
  if (!st || st->steps <= 0) return;
  std::fprintf(stderr,
               "[shardlm] worker rank %d: %lld steps, %.2f s in steps, "
               "%.2f s (%.0f%%) in communication\n",
               rank, static_cast<long long>(st->steps), st->forward_seconds,
               st->comm_seconds, 100 * st->comm_seconds / st->forward_seconds);
  if (st->cp_split_steps + st->cp_whole_steps > 0) {
    const auto per = [](int64_t bytes, int64_t steps) {
      return steps > 0 ? static_cast<double>(bytes) / steps : 0.0;
    };
    std::fprintf(stderr,
                 "[shardlm] worker rank %d: CP sent %lld bytes in %lld "
                 "sequence-parallel steps (%.0f per step), %lld bytes in "
                 "%lld whole steps (%.0f per step)\n",
                 rank, static_cast<long long>(st->cp_split_bytes),
                 static_cast<long long>(st->cp_split_steps),
                 per(st->cp_split_bytes, st->cp_split_steps),
                 static_cast<long long>(st->cp_whole_bytes),
                 static_cast<long long>(st->cp_whole_steps),
                 per(st->cp_whole_bytes, st->cp_whole_steps));
  }
}

int RunWorker(MpiCommunicator& world, MpiCommunicator& workers,
              const LaunchFlags& f, const WeightSource& source,
              const std::string& digest, uint64_t model_bytes,
              const sigset_t& stop_signals, const std::string& device) {
  // CPU workers exchange activations over MPI (split now: a collective of
  // every worker); GPU workers over NCCL, whose ids meet in the
  // coordinator's store once its address is known.
  const bool on_gpu = device.rfind("cuda:", 0) == 0;
  const int gpu = on_gpu ? std::atoi(device.c_str() + 5) : 0;
  absl::StatusOr<std::unique_ptr<CommShardHost>> mpi_host =
      on_gpu ? absl::StatusOr<std::unique_ptr<CommShardHost>>(nullptr)
             : MpiShardHost(&source, workers, static_cast<int>(f.tp),
                            static_cast<int>(f.pp), static_cast<int>(f.cp));
  Tensor packed = *Tensor::Host(DType::kI32, {kMessageInts});
  if (absl::Status s = world.Broadcast(packed, 0); !s.ok()) {
    std::fprintf(stderr, "shardlm launch (rank %d): %s\n", world.rank(),
                 std::string(s.message()).c_str());
    return 1;
  }
  const std::string message = UnpackText(packed.raw());
  if (message.empty()) return 1;  // The coordinator said why.
  const std::string address = message.substr(0, message.find(' '));
  const std::string token = message.find(' ') == std::string::npos
                                ? ""
                                : message.substr(message.find(' ') + 1);
  std::unique_ptr<ControlPlaneStore> store;
  std::string gpu_uuid;
  absl::StatusOr<std::unique_ptr<ShardHost>> host =
      [&]() -> absl::StatusOr<std::unique_ptr<ShardHost>> {
    if (!on_gpu) {
      if (!mpi_host.ok()) return mpi_host.status();
      return std::unique_ptr<ShardHost>(std::move(*mpi_host));
    }
    ASSIGN_OR_RETURN(gpu_uuid, GpuUuid(gpu));
    store = std::make_unique<ControlPlaneStore>(
        NewControlChannel(address, f.control_tls.loaded,
                          grpc::ChannelArguments()),
        address, token);
    std::fprintf(stderr, "[shardlm] worker rank %d: cuda:%d (%s)\n",
                 world.rank(), gpu, gpu_uuid.c_str());
    return NewCudaShardHost(
        &source,
        {.device = gpu,
         .rank = world.rank(),
         .store = store.get(),
         .timeout = absl::Seconds(f.startup_timeout_s),
         .cuda_weights =
             ParseCudaWeights(f.cuda_weights).value_or(CudaWeights::kBf16)});
  }();
  if (!host.ok()) {
    std::fprintf(stderr, "shardlm launch (rank %d): %s\n", world.rank(),
                 std::string(host.status().message()).c_str());
    return 1;
  }
  absl::Notification stop;  // See NotifyWorkerStopOnSignal.
  NotifyWorkerStopOnSignal(stop_signals, absl::Seconds(f.api.drain_timeout_s),
                           &stop);
  const absl::Status s = RunWorkerAgent(
      {.coordinator = address,
       .rank = world.rank(),
       .model_path = f.model,
       .model_bytes = model_bytes,
       .model_digest = digest,
       .cluster_token = token,
       .device = on_gpu ? "cuda" : "cpu",
       .gpu_uuid = gpu_uuid,
       .gpu_ordinal = gpu,
       // Workers may wait for the coordinator as long as startup may take.
       .connect_timeout = absl::Seconds(f.startup_timeout_s),
       .on_abandon =
           [](const std::string& why) {
             std::fprintf(stderr, "shardlm launch (%s)\n", why.c_str());
             Exit(1);
           },
       .stop = &stop,
       .tls = f.control_tls.loaded},
      **host);
  PrintRunnerStats(world.rank(), **host);
  if (s.ok() || absl::IsCancelled(s)) return 0;
  // A refusal or a failed load was reported by the coordinator, which
  // prints one message for the cluster; a worker speaks only when it has
  // lost the coordinator.
  if (absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s)) {
    std::fprintf(stderr, "shardlm launch (worker rank %d): %s\n", world.rank(),
                 std::string(s.message()).c_str());
  }
  return 1;
}

void RegisterLaunchFlags(FlagSet& flags, LaunchFlags& f) {
  f.Register(flags,
             "GGUF file or safetensors directory, at the same path on every "
             "node");
  flags.Add("control-listen", &f.control_listen,
            "address the control plane (workers) listens on; default: the "
            "advertised address (127.0.0.1 when every rank is on this "
            "host) at --control-port. Workers need the cluster token either "
            "way (random per launch, or SHARDLM_CLUSTER_TOKEN)");
  flags.Add("control-port", &f.control_port,
            "port workers connect to (0: any free port)");
  flags.Add("advertise-address", &f.advertise_address,
            "host or address workers dial to reach rank 0; default: rank "
            "0's address on the subnet the workers share (see "
            "docs/multinode.md); set, the control plane listens on 0.0.0.0");
  flags.Add("cuda-weights", &f.cuda_weights, kCudaWeightsHelp);
  f.control_tls.RegisterServerName(flags);
}

// The first problem with the parsed flags and the world's size ("" if
// none): the same on every rank.
std::string LaunchProblem(const LaunchFlags& f, int world_size) {
  if (std::string p = f.Problem(); !p.empty()) {
    return p;
  } else if (absl::StatusOr<CudaWeights> w = ParseCudaWeights(f.cuda_weights);
             !w.ok()) {
    return std::string(w.status().message());
  } else if (const int64_t workers = f.tp * f.pp * f.cp;
             world_size != 1 + workers) {
    return absl::StrCat(
        "the MPI world has ", world_size, " ranks but --tp ", f.tp, " x --pp ",
        f.pp, f.cp > 1 ? absl::StrCat(" x --cp ", f.cp) : "", " needs 1 + ",
        workers, " = ", 1 + workers, " (mpirun -np ", 1 + workers, ")");
  }
  return "";
}

// What each rank can check alone: the control plane's TLS files, its model
// file and the shard plan; a worker also digests the model's files. This
// rank's reason ("" if none).
std::string CheckThisRank(
    LaunchFlags& f, bool root,
    const absl::StatusOr<std::unique_ptr<WeightSource>>& source,
    std::string* digest, uint64_t* model_bytes) {
  std::string mine;
  if (absl::Status s = f.control_tls.Load(); !s.ok()) {
    mine = absl::StrCat(Hostname(), ": ", s.message());
  } else if (!source.ok()) {
    mine = absl::StrCat(Hostname(), ": ", source.status().message());
  } else if (absl::Status cp = CheckContextParallel((*source)->config(),
                                                    static_cast<int>(f.cp));
             !cp.ok()) {
    mine = std::string(cp.message());
  } else if (auto plan = PlanShards(**source, static_cast<int>(f.tp),
                                    static_cast<int>(f.pp), f.MoeShardingOf());
             !plan.ok()) {
    mine = std::string(plan.status().message());
  } else if (!root) {
    auto d = ModelDigest(f.model, model_bytes);
    if (d.ok()) {
      *digest = *d;
    } else {
      mine = absl::StrCat(Hostname(), ": ", d.status().message());
    }
  }
  return mine;
}

}  // namespace

int LaunchCommand(int argc, char** argv) {
  // Stop signals are taken by sigwait (every thread, MPI's and gRPC's
  // included, inherits the mask).
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  auto world_or = MpiCommunicator::World({.timeout = absl::Seconds(600)});
  if (!world_or.ok()) {
    std::fprintf(stderr, "shardlm launch: %s\n",
                 std::string(world_or.status().message()).c_str());
    return 1;
  }
  MpiCommunicator& world = **world_or;
  const bool root = world.rank() == 0;

  LaunchFlags f;
  FlagSet flags(
      "usage: mpirun --enable-recovery -np 1+TP*PP*CP shardlm launch --model "
      "PATH --tp TP --pp PP [--cp CP] [flags]\n"
      "Rank 0 coordinates and serves the API on --listen; the other ranks\n"
      "are workers holding one shard each (see launch/run-local-cluster.sh).");
  RegisterLaunchFlags(flags, f);
  std::string problem;
  bool usage = false;  // Show the flags after the problem?
  if (absl::Status s = flags.Parse(argc, argv, 2); !s.ok()) {
    problem = std::string(s.message());
    usage = true;
  } else if (flags.help()) {
    if (root) std::fputs(flags.Usage().c_str(), stdout);
    Exit(0);
  } else {
    problem = LaunchProblem(f, world.size());
  }
  if (!problem.empty()) {  // The same on every rank: rank 0 reports.
    if (root) {
      std::fprintf(stderr, "shardlm launch: %s\n%s%s", problem.c_str(),
                   usage ? "\n" : "", usage ? flags.Usage().c_str() : "");
    }
    Exit(2);
  }

  // What each rank can check alone: its model file and the shard plan.
  auto source = OpenWeights(f.model);
  std::string digest;
  uint64_t model_bytes = 0;
  const std::string mine =
      CheckThisRank(f, root, source, &digest, &model_bytes);
  if (!AgreeAllOk(world, mine)) Exit(1);

  // Workers get a communicator of their own; the coordinator one of its own.
  auto workers = world.Split(root ? 1 : 0, world.rank(), "workers");
  if (!workers.ok()) {
    std::fprintf(stderr, "shardlm launch (rank %d): %s\n", world.rank(),
                 std::string(workers.status().message()).c_str());
    Exit(1);
  }
  absl::StatusOr<std::vector<NodeInfo>> nodes = GatherNodes(world);
  if (!nodes.ok()) {
    std::fprintf(stderr, "shardlm launch (rank %d): %s\n", world.rank(),
                 std::string(nodes.status().message()).c_str());
    Exit(1);
  }
  // Where the workers run: each resolves --device for itself, and they
  // must agree on the kind.
  const std::string device =
      root ? "" : ResolveWorkerDevice(f, *nodes, world.rank());
  const std::string kind = AgreeOnDevice(world, device, f);
  if (kind.empty()) Exit(1);
  // The same answer on every rank (the same flags and kind): all exit.
  if (absl::StatusOr<DType> kv = f.KvDType(kind); !kv.ok()) {
    if (root) {
      std::fprintf(stderr, "shardlm launch: %s\n",
                   std::string(kv.status().message()).c_str());
    }
    Exit(2);
  }
  const int code =
      root ? RunCoordinator(world, f, **source, stop_signals, *nodes, kind)
           : RunWorker(world, **workers, f, **source, digest, model_bytes,
                       stop_signals, kind == "cuda" ? device : "cpu");
  Exit(code);
}

}  // namespace shardlm
