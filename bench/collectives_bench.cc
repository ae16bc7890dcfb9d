// Bus bandwidth of the collectives, as nccl-tests reports it (a benchmark,
// not a test):
//   collectives_bench [--backends inprocess,gloo] [--ranks 2]
//                     [--sizes 4K,64K,1M,16M] [--ops all_reduce,all_gather]
//                     [--seconds 0.3] [--json out.json]
//   mpirun -np N collectives_bench --backends mpi ...
// For each backend, op and size: the time of one call (the slowest rank's
// mean over as many calls as fit in --seconds, after warm-up calls), its
// algorithm bandwidth (bytes / time) and its bus bandwidth: algbw x 2(n -
// 1)/n for an all-reduce, x (n - 1)/n for an all-gather, where a size is
// the all-reduce's buffer and the all-gather's whole output (nccl-tests'
// conventions), so that busbw compares with the link's bandwidth whatever
// the rank count.
//
// Backends: `inprocess` (MakeFakeGroup: ranks on threads sharing memory,
// what the in-process executor uses), `gloo` (ranks on threads, Gloo over
// TCP on loopback: what `shardlm worker` processes use between machines),
// `mpi` (the processes mpirun starts: --ranks is their count there), and
// `nccl` in CUDA builds (ranks on threads, one GPU each; it needs as many
// GPUs as ranks and says so otherwise).
//
// Exits 1 when a collective's result is wrong (every rank's buffer is
// checked after its timed calls), 2 on bad flags or a backend that cannot
// start.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bench/cpu_name.h"
#include "collectives/fake_communicator.h"
#include "collectives/gloo_communicator.h"
#include "collectives/mpi_communicator.h"
#include "collectives/rendezvous_store.h"
#include "core/status.h"
#include "launch/flags.h"
#include "nlohmann/json.hpp"

#ifdef SHARDLM_BENCH_NCCL
#include <cuda_runtime_api.h>

#include "collectives/nccl_communicator.h"
#endif

namespace shardlm {
namespace {

using Clock = std::chrono::steady_clock;

enum class Op { kAllReduce, kAllGather };

const char* OpName(Op op) {
  return op == Op::kAllReduce ? "all_reduce" : "all_gather";
}

// The bus bandwidth factor of `op` over n ranks (nccl-tests' PERFORMANCE.md).
double BusFactor(Op op, int n) {
  return op == Op::kAllReduce ? 2.0 * (n - 1) / n
                              : static_cast<double>(n - 1) / n;
}

struct Row {
  std::string backend;
  Op op;
  int ranks = 0;
  int64_t bytes = 0;
  int64_t calls = 0;
  double seconds_per_call = 0;  // The slowest rank's mean.
  double AlgBw() const { return bytes / seconds_per_call / 1e9; }
  double BusBw() const { return AlgBw() * BusFactor(op, ranks); }
};

// A rank's buffers: host f32 tensors, or (nccl) device ones with host
// copies to fill and check.
struct Buffers {
  Tensor send, recv;
  std::function<absl::Status(const std::vector<float>&, Tensor&)> upload;
  std::function<absl::StatusOr<std::vector<float>>(const Tensor&)> download;
};

absl::StatusOr<Buffers> HostBuffers(int64_t send_n, int64_t recv_n) {
  Buffers b;
  ASSIGN_OR_RETURN(b.send, Tensor::Host(DType::kF32, {send_n}));
  ASSIGN_OR_RETURN(b.recv, Tensor::Host(DType::kF32, {recv_n}));
  b.upload = [](const std::vector<float>& v, Tensor& t) {
    std::copy(v.begin(), v.end(), t.f32().begin());
    return absl::OkStatus();
  };
  b.download = [](const Tensor& t) -> absl::StatusOr<std::vector<float>> {
    return std::vector<float>(t.f32().begin(), t.f32().end());
  };
  return b;
}

// Rank r's input: element i is r + 1 + (i % 7) / 8, exact in f32 and
// distinct per rank, so that a sum or a gather in the wrong order shows.
std::vector<float> Input(int rank, int64_t n) {
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = rank + 1 + (i % 7) / 8.0f;
  return v;
}

// What every rank's recv must hold after the op.
bool Correct(Op op, int ranks, int64_t send_n, const std::vector<float>& got) {
  for (int64_t i = 0; i < static_cast<int64_t>(got.size()); ++i) {
    float want = 0;
    if (op == Op::kAllReduce) {
      for (int r = 0; r < ranks; ++r) want += r + 1 + (i % 7) / 8.0f;
    } else {
      want = i / send_n + 1 + (i % send_n % 7) / 8.0f;
    }
    if (got[i] != want) return false;
  }
  return true;
}

// One rank's part of a measurement: fills its input, runs warm-up calls
// and then calls for about `seconds` (the count sized by rank 0's clock
// over 10 calls, broadcast so that every rank makes as many), checks its
// output.
// Returns its mean seconds per timed call, or -1 when the output is wrong.
absl::StatusOr<double> RankRun(Communicator& c, Op op, double seconds,
                               Buffers& b, int64_t* calls) {
  const int n = c.size();
  const int64_t send_n = b.send.numel();
  RETURN_IF_ERROR(b.upload(Input(c.rank(), send_n), b.send));
  const auto call = [&] {
    return op == Op::kAllReduce ? c.AllReduce(b.send, b.recv, ReduceOp::kSum)
                                : c.AllGather(b.send, b.recv);
  };
  for (int i = 0; i < 3; ++i) RETURN_IF_ERROR(call());
  // Rank 0 times 10 calls to size the run; everyone then runs it.
  RETURN_IF_ERROR(c.Barrier());
  auto start = Clock::now();
  for (int i = 0; i < 10; ++i) RETURN_IF_ERROR(call());
  const double probe =
      std::chrono::duration<double>(Clock::now() - start).count() / 10;
  ASSIGN_OR_RETURN(Tensor count, Tensor::Host(DType::kF32, {1}));
  count.f32()[0] = static_cast<float>(
      std::clamp<double>(seconds / std::max(probe, 1e-9), 5, 100000));
  RETURN_IF_ERROR(c.Broadcast(count, 0));
  *calls = static_cast<int64_t>(count.f32()[0]);
  RETURN_IF_ERROR(c.Barrier());
  start = Clock::now();
  for (int64_t i = 0; i < *calls; ++i) RETURN_IF_ERROR(call());
  const double mean =
      std::chrono::duration<double>(Clock::now() - start).count() / *calls;
  ASSIGN_OR_RETURN(std::vector<float> got, b.download(b.recv));
  return Correct(op, n, send_n, got) ? mean : -1.0;
}

// A rank's send elements for `op` on `bytes` over n ranks (an all-gather's
// bytes are its output's, cut to a multiple of n values), and its receive
// elements.
int64_t SendElements(Op op, int64_t bytes, int n) {
  return op == Op::kAllReduce ? bytes / 4 : std::max<int64_t>(1, bytes / 4 / n);
}
int64_t RecvElements(Op op, int64_t bytes, int n) {
  return op == Op::kAllReduce ? bytes / 4 : SendElements(op, bytes, n) * n;
}

// Runs a measurement over ranks on threads (one communicator each) and
// folds their results into `row`: the slowest rank's time. `make_buffers`
// gives rank r its buffers.
absl::Status ThreadedRun(
    std::vector<std::unique_ptr<Communicator>>& comms, Op op, int64_t bytes,
    double seconds,
    const std::function<absl::StatusOr<Buffers>(int, int64_t, int64_t)>&
        make_buffers,
    Row& row, bool& wrong) {
  const int n = static_cast<int>(comms.size());
  std::vector<absl::StatusOr<double>> results(n, 0.0);
  std::vector<int64_t> calls(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      absl::StatusOr<Buffers> b = make_buffers(r, SendElements(op, bytes, n),
                                               RecvElements(op, bytes, n));
      if (!b.ok()) {
        results[r] = b.status();
        return;
      }
      results[r] = RankRun(*comms[r], op, seconds, *b, &calls[r]);
    });
  }
  for (std::thread& t : threads) t.join();
  row.seconds_per_call = 0;
  for (int r = 0; r < n; ++r) {
    RETURN_IF_ERROR(results[r].status());
    if (*results[r] < 0) wrong = true;
    row.seconds_per_call = std::max(row.seconds_per_call, *results[r]);
  }
  row.calls = calls[0];
  return absl::OkStatus();
}

// A group's n members, each made on a thread of its own by `join(rank)`
// (every member waits for the others while it joins); the first error.
template <typename Join>
absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> JoinOnThreads(
    int n, Join join) {
  std::vector<decltype(join(0))> made(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] { made[r] = join(r); });
  }
  for (std::thread& t : threads) t.join();
  std::vector<std::unique_ptr<Communicator>> out;
  for (auto& c : made) {
    RETURN_IF_ERROR(c.status());
    out.push_back(*std::move(c));
  }
  return out;
}

// A group of `n` communicators of `backend` on threads.
absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> ThreadedGroup(
    const std::string& backend, int n) {
  if (backend == "inprocess") return MakeFakeGroup(n, "bench");
  if (backend != "gloo") {
    return absl::InvalidArgumentError(
        absl::StrCat("no threaded group for backend '", backend, "'"));
  }
  ASSIGN_OR_RETURN(std::shared_ptr<GlooTransport> transport,
                   GlooTransport::Create("127.0.0.1"));
  InMemoryStore store;
  return JoinOnThreads(n, [&](int r) {
    return GlooCommunicator::Connect(store, "bench/", transport, "bench", r, n);
  });
}

#ifdef SHARDLM_BENCH_NCCL
absl::Status CudaOk(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(e)));
}

absl::StatusOr<Tensor> DeviceF32(int device, int64_t n) {
  RETURN_IF_ERROR(CudaOk(cudaSetDevice(device), "cudaSetDevice"));
  void* p = nullptr;
  RETURN_IF_ERROR(CudaOk(cudaMalloc(&p, n * 4), "cudaMalloc"));
  return Tensor::Owning(DType::kF32, {n}, p, MemoryType::kDevice,
                        std::shared_ptr<void>(p, [](void* q) { cudaFree(q); }));
}

absl::StatusOr<Buffers> DeviceBuffers(int device, int64_t send_n,
                                      int64_t recv_n) {
  Buffers b;
  ASSIGN_OR_RETURN(b.send, DeviceF32(device, send_n));
  ASSIGN_OR_RETURN(b.recv, DeviceF32(device, recv_n));
  b.upload = [device](const std::vector<float>& v, Tensor& t) {
    RETURN_IF_ERROR(CudaOk(cudaSetDevice(device), "cudaSetDevice"));
    return CudaOk(
        cudaMemcpy(t.raw(), v.data(), v.size() * 4, cudaMemcpyHostToDevice),
        "cudaMemcpy");
  };
  b.download = [device](const Tensor& t) -> absl::StatusOr<std::vector<float>> {
    RETURN_IF_ERROR(CudaOk(cudaSetDevice(device), "cudaSetDevice"));
    std::vector<float> v(t.numel());
    RETURN_IF_ERROR(
        CudaOk(cudaMemcpy(v.data(), t.raw(), t.bytes(), cudaMemcpyDeviceToHost),
               "cudaMemcpy"));
    return v;
  };
  return b;
}

absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> NcclGroup(int n) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess) devices = 0;
  if (devices < n) {
    return absl::FailedPreconditionError(
        absl::StrCat("nccl: ", n, " ranks need ", n, " GPUs (one each); ",
                     devices, " visible"));
  }
  ASSIGN_OR_RETURN(const std::string id, NewNcclUniqueId());
  return JoinOnThreads(n, [&](int r) {
    return NcclCommunicator::Create(
        {.unique_id = id, .rank = r, .size = n, .device = r, .name = "bench"});
  });
}
#endif

// This process's part of an MPI measurement; row gets the slowest rank's
// time, `wrong` whether any rank's result was.
absl::Status MpiRun(Communicator& world, Op op, int64_t bytes, double seconds,
                    Row& row, bool& wrong) {
  const int n = world.size();
  ASSIGN_OR_RETURN(Buffers b, HostBuffers(SendElements(op, bytes, n),
                                          RecvElements(op, bytes, n)));
  ASSIGN_OR_RETURN(const double mean,
                   RankRun(world, op, seconds, b, &row.calls));
  ASSIGN_OR_RETURN(Tensor t, Tensor::Host(DType::kF32, {2}));
  t.f32()[0] = static_cast<float>(mean);
  t.f32()[1] = mean < 0 ? 1.0f : 0.0f;
  RETURN_IF_ERROR(world.AllReduce(t, t, ReduceOp::kMax));
  row.seconds_per_call = t.f32()[0];
  wrong |= t.f32()[1] > 0;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int64_t>> ParseSizes(const std::string& arg) {
  std::vector<int64_t> out;
  for (absl::string_view s : absl::StrSplit(arg, ',')) {
    int64_t scale = 1;
    if (!s.empty() && (s.back() == 'K' || s.back() == 'M' || s.back() == 'G')) {
      scale = s.back() == 'K' ? 1 << 10 : s.back() == 'M' ? 1 << 20 : 1 << 30;
      s.remove_suffix(1);
    }
    int64_t v = 0;
    if (!absl::SimpleAtoi(s, &v) || v < 1 || v * scale % 4 != 0 ||
        v * scale > (int64_t{1} << 32)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--sizes: '", std::string(s),
                       "' is not a byte count (a multiple of 4, K, M or G "
                       "suffix, at most 4G)"));
    }
    out.push_back(v * scale);
  }
  return out;
}

std::string SizeString(int64_t bytes) {
  if (bytes % (1 << 20) == 0) return absl::StrCat(bytes >> 20, "M");
  if (bytes % (1 << 10) == 0) return absl::StrCat(bytes >> 10, "K");
  return absl::StrCat(bytes);
}

int Main(int argc, char** argv) {
  std::string backends_arg = "inprocess,gloo", sizes_arg = "4K,64K,1M,16M";
  std::string ops_arg = "all_reduce,all_gather", json_path;
  int64_t ranks = 2;
  double seconds = 0.3;
  FlagSet flags("usage: collectives_bench [flags]");
  flags.Add("backends", &backends_arg,
            "comma-separated: inprocess, gloo, mpi (under mpirun), nccl "
            "(CUDA builds)");
  flags.Add("ranks", &ranks, "ranks on threads (mpi: mpirun's -np)");
  flags.Add("sizes", &sizes_arg,
            "comma-separated bytes per call (all-gather: its whole output)");
  flags.Add("ops", &ops_arg, "comma-separated: all_reduce, all_gather");
  flags.Add("seconds", &seconds, "time spent per measurement");
  flags.Add("json", &json_path, "also write results here");
  absl::Status s = flags.Parse(argc, argv, 1);
  absl::StatusOr<std::vector<int64_t>> sizes = ParseSizes(sizes_arg);
  if (s.ok()) s = sizes.status();
  if (s.ok() && (ranks < 2 || ranks > 64 || !(seconds > 0))) {
    s = absl::InvalidArgumentError(
        "--ranks must be in [2, 64] and --seconds positive");
  }
  std::vector<Op> ops;
  for (absl::string_view o : absl::StrSplit(ops_arg, ',')) {
    if (o == "all_reduce") {
      ops.push_back(Op::kAllReduce);
    } else if (o == "all_gather") {
      ops.push_back(Op::kAllGather);
    } else if (s.ok()) {
      s = absl::InvalidArgumentError(absl::StrCat("--ops: '", std::string(o),
                                                  "' is not all_reduce or "
                                                  "all_gather"));
    }
  }
  if (!s.ok()) {
    std::fprintf(stderr, "collectives_bench: %s\n%s",
                 std::string(s.message()).c_str(), flags.Usage().c_str());
    return 2;
  }
  const std::vector<std::string> backends = absl::StrSplit(backends_arg, ',');

  // Under mpirun every process runs this; rank 0 prints.
  std::unique_ptr<MpiRuntime> mpi;
  std::unique_ptr<MpiCommunicator> world;
  bool prints = true;
  if (std::find(backends.begin(), backends.end(), "mpi") != backends.end()) {
    absl::StatusOr<std::unique_ptr<MpiRuntime>> rt = MpiRuntime::Start();
    absl::StatusOr<std::unique_ptr<MpiCommunicator>> w =
        rt.ok() ? MpiCommunicator::World() : rt.status();
    if (!w.ok() || (*w)->size() < 2) {
      std::fprintf(
          stderr, "collectives_bench: mpi needs mpirun -np N (N >= 2): %s\n",
          w.ok() ? "one process" : std::string(w.status().message()).c_str());
      return 2;
    }
    mpi = *std::move(rt);
    world = *std::move(w);
    prints = world->rank() == 0;
  }
  if (prints) {
    std::printf("collectives_bench on %s, %u hardware threads\n",
                CpuName().c_str(), std::thread::hardware_concurrency());
    std::printf("%-10s %-10s %5s %8s %8s %12s %12s %12s\n", "backend", "op",
                "ranks", "size", "calls", "time (us)", "algbw GB/s",
                "busbw GB/s");
  }
  std::vector<Row> rows;
  bool wrong = false;
  for (const std::string& backend : backends) {
    for (Op op : ops) {
      for (int64_t bytes : *sizes) {
        Row row{.backend = backend, .op = op};
        row.ranks = backend == "mpi" ? world->size() : static_cast<int>(ranks);
        row.bytes = RecvElements(op, bytes, row.ranks) * 4;
        absl::Status run;
        if (backend == "mpi") {
          run = MpiRun(*world, op, bytes, seconds, row, wrong);
        } else {
          absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> group;
          std::function<absl::StatusOr<Buffers>(int, int64_t, int64_t)> make =
              [](int, int64_t send_n, int64_t recv_n) {
                return HostBuffers(send_n, recv_n);
              };
#ifdef SHARDLM_BENCH_NCCL
          if (backend == "nccl") {
            group = NcclGroup(row.ranks);
            make = [](int r, int64_t send_n, int64_t recv_n) {
              return DeviceBuffers(r, send_n, recv_n);
            };
          } else {
            group = ThreadedGroup(backend, row.ranks);
          }
#else
          group = backend == "nccl"
                      ? absl::UnimplementedError("nccl: this build has no CUDA")
                      : ThreadedGroup(backend, row.ranks);
#endif
          run = group.ok()
                    ? ThreadedRun(*group, op, bytes, seconds, make, row, wrong)
                    : group.status();
        }
        if (!run.ok()) {
          std::fprintf(stderr, "collectives_bench: %s %s %s: %s\n",
                       backend.c_str(), OpName(op), SizeString(bytes).c_str(),
                       std::string(run.message()).c_str());
          return 2;
        }
        if (prints) {
          std::printf("%-10s %-10s %5d %8s %8lld %12.1f %12.3f %12.3f\n",
                      backend.c_str(), OpName(op), row.ranks,
                      SizeString(bytes).c_str(),
                      static_cast<long long>(row.calls),
                      row.seconds_per_call * 1e6, row.AlgBw(), row.BusBw());
          std::fflush(stdout);
        }
        rows.push_back(row);
      }
    }
  }
  if (prints && !json_path.empty()) {
    nlohmann::json j = {{"cpu", CpuName()}, {"rows", nlohmann::json::array()}};
    for (const Row& r : rows) {
      j["rows"].push_back({{"backend", r.backend},
                           {"op", OpName(r.op)},
                           {"ranks", r.ranks},
                           {"bytes", r.bytes},
                           {"calls", r.calls},
                           {"seconds_per_call", r.seconds_per_call},
                           {"algbw_gbps", r.AlgBw()},
                           {"busbw_gbps", r.BusBw()}});
    }
    std::ofstream(json_path) << j.dump(2) << "\n";
  }
  if (wrong) {
    std::fprintf(stderr,
                 "collectives_bench: a collective's result was wrong\n");
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace shardlm

int main(int argc, char** argv) { return shardlm::Main(argc, argv); }
