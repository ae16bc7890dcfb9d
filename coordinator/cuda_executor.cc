// StepExecutors on GPUs (built only with CUDA; cuda_executor_stub.cc in
// binaries without it): one CudaModelRunner, or tp * pp of them on threads.
#include "coordinator/cuda_executor.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <limits>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "backend/cuda_backend.h"
#include "backend/device.h"
#include "collectives/staged_communicator.h"
#include "coordinator/in_process_executor.h"
#include "core/log.h"
#include "core/status.h"
#include "model/shard_plan.h"
#include "worker/cuda_model_runner.h"

namespace shardlm {

CudaAvailability QueryCuda() {
  CudaAvailability a{.built_with_cuda = true};
  absl::StatusOr<int> n = CudaDeviceCount();
  if (n.ok()) {
    a.devices = *n;
  } else {
    a.why_none = std::string(n.status().message());
  }
  return a;
}

namespace {

// One runner on one GPU; sampling on the device.
class CudaExecutor : public StepExecutor {
 public:
  const char* backend() const override { return "cuda"; }
  CudaExecutor(std::unique_ptr<CudaModelRunner> runner, int device)
      : runner_(std::move(runner)), device_(device) {}
  const ModelConfig& config() const override { return runner_->config(); }
  int64_t num_kv_blocks() const override {
    return runner_->kv_config().num_blocks;
  }
  int64_t num_host_kv_blocks() const override {
    return runner_->kv_config().num_host_blocks;
  }
  // bf16 bytes on the device (not the f32 bytes of the CPU runner).
  int64_t weight_bytes() const override { return runner_->weight_bytes(); }
  DType kv_cache_dtype() const override { return runner_->kv_dtype(); }
  std::vector<RunnerStats> RankStats() const override {
    return {runner_->stats()};
  }
  // The step figures, and the GPU's memory in use and in all (any thread:
  // cudaMemGetInfo asks the calling thread's current device).
  std::vector<RankReport> RankReports() const override {
    RankReport r{.rank = 1,
                 .stats = runner_->stats(),
                 .weight_bytes = runner_->weight_bytes(),
                 .kv_bytes = runner_->kv_config().num_blocks *
                             runner_->kv_config().BytesPerBlock(),
                 .host_kv_bytes = runner_->kv_config().num_host_blocks *
                                  runner_->kv_config().BytesPerBlock()};
    size_t free = 0, total = 0;
    if (cudaSetDevice(device_) == cudaSuccess &&
        cudaMemGetInfo(&free, &total) == cudaSuccess) {
      r.gpu_memory_used_bytes = static_cast<int64_t>(total - free);
      r.gpu_memory_total_bytes = static_cast<int64_t>(total);
    }
    return {r};
  }
  absl::StatusOr<StepOutput> Forward(const StepInput& step) override {
    return runner_->Step(step);
  }

 private:
  std::unique_ptr<CudaModelRunner> runner_;
  int device_;
};

std::string Gib(int64_t bytes) {
  return absl::StrFormat("%.2f GiB", static_cast<double>(bytes) / (1 << 30));
}

}  // namespace

absl::StatusOr<int64_t> SizeGpuKv(const std::vector<GpuRankKv>& ranks,
                                  int64_t kv_cache_bytes,
                                  double gpu_memory_utilization,
                                  int32_t block_size,
                                  int64_t placeholder_blocks,
                                  std::string* why) {
  if (ranks.empty() || block_size <= 0 || placeholder_blocks < 0) {
    return absl::InvalidArgumentError("SizeGpuKv: no ranks or no block size");
  }
  // Block ids and KV slots are int32.
  const int64_t max_blocks = std::numeric_limits<int32_t>::max() / block_size;
  int64_t blocks = max_blocks;
  if (kv_cache_bytes > 0) {
    for (const GpuRankKv& r : ranks) {
      blocks = std::min(blocks, kv_cache_bytes / r.block_bytes);
    }
    if (blocks < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--kv-cache-bytes ", kv_cache_bytes, " holds no KV block of ",
          ranks[0].block_bytes, " bytes"));
    }
    *why = absl::StrCat(blocks, " KV blocks per rank from --kv-cache-bytes");
    return blocks;
  }
  // Every rank gets the same number of blocks: the fewest any GPU holds
  // for all of its ranks.
  std::map<int, int64_t> per_device;  // Bytes of one block of each rank.
  for (const GpuRankKv& r : ranks) per_device[r.device] += r.block_bytes;
  bool first = true;
  for (const auto& [device, block_bytes] : per_device) {
    size_t free = 0, total = 0;
    if (cudaSetDevice(device) != cudaSuccess ||
        cudaMemGetInfo(&free, &total) != cudaSuccess) {
      cudaGetLastError();
      return absl::InternalError(
          absl::StrCat("cudaMemGetInfo on CUDA device ", device, " failed"));
    }
    // The placeholder pools are freed before the real ones are allocated.
    ASSIGN_OR_RETURN(
        GpuKvPlan plan,
        PlanGpuKv({.total_bytes = static_cast<int64_t>(total),
                   .free_bytes = static_cast<int64_t>(free) +
                                 placeholder_blocks * block_bytes},
                  gpu_memory_utilization, block_bytes, max_blocks));
    if (plan.blocks < blocks || first) {
      blocks = plan.blocks;
      *why = absl::StrCat("device ", device, ": ", plan.explanation);
    }
    first = false;
  }
  return blocks;
}

absl::StatusOr<std::unique_ptr<StepExecutor>> CreateCudaExecutor(
    const WeightSource& source, const CudaExecutorOptions& o) {
  if (o.kv.block_size <= 0 || o.kv.kv_cache_bytes < 0 ||
      o.limits.max_batched_tokens <= 0 || o.limits.max_seqs <= 0 || o.tp < 1 ||
      o.pp < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA executor: block_size (", o.kv.block_size,
                     "), max_batched_tokens (", o.limits.max_batched_tokens,
                     "), max_seqs (", o.limits.max_seqs, "), tp (", o.tp,
                     ") and pp (", o.pp, ") must be positive, kv_cache_bytes (",
                     o.kv.kv_cache_bytes, ") not negative"));
  }
  const CudaAvailability cuda = QueryCuda();
  if (cuda.devices == 0) return absl::FailedPreconditionError(cuda.why_none);
  const int ranks = o.tp * o.pp;
  std::vector<int> devices;
  if (ranks == 1) {
    if (o.device < 0 || o.device >= cuda.devices) {
      return absl::InvalidArgumentError(
          absl::StrCat("CUDA device ", o.device, " of ", cuda.devices));
    }
    devices = {o.device};
  } else {
    ASSIGN_OR_RETURN(devices,
                     AssignGpus(ranks, cuda.devices, o.allow_shared_gpu));
  }
  ASSIGN_OR_RETURN(ShardPlan plan, PlanShards(source, o.tp, o.pp));

  // Each shard's weights go up one at a time (the f32 host copy is dropped
  // once uploaded), then every runner reserves its activations, and only
  // then is the rest of each GPU's memory given to the KV caches.
  std::vector<std::unique_ptr<CudaModelRunner>> runners;
  int64_t weight_bytes = 0;
  for (size_t r = 0; r < plan.shards.size(); ++r) {
    const ShardSpec& spec = plan.shards[r];
    ASSIGN_OR_RETURN(LlamaWeights host, LoadLlamaWeights(source, spec));
    const ModelConfig c = host.config;  // A copy: `host` is dropped below.
    const KvPoolConfig kv{.n_layers = spec.n_layers(),
                          .kv_heads = spec.n_kv_heads(),
                          .head_dim = c.head_dim,
                          .block_size = o.kv.block_size,
                          .num_blocks = 1,  // Sized below.
                          .dtype = DType::kBF16};
    ASSIGN_OR_RETURN(std::unique_ptr<CudaModelRunner> runner,
                     CudaModelRunner::Create(devices[r], c, kv));
    ASSIGN_OR_RETURN(
        LlamaWeights weights,
        UploadLlamaWeights(host, runner->backend(), runner->exec()));
    host = LlamaWeights();
    weight_bytes += weights.bytes();
    RETURN_IF_ERROR(runner->SetWeights(std::move(weights)));
    RETURN_IF_ERROR(runner->ReserveActivations(o.limits.max_batched_tokens,
                                               std::max(o.limits.max_seqs, 1)));
    RETURN_IF_ERROR(runner->Synchronize());
    runners.push_back(std::move(runner));
  }

  std::vector<GpuRankKv> ranks_kv;
  for (size_t r = 0; r < runners.size(); ++r) {
    ranks_kv.push_back(
        {.device = devices[r],
         .block_bytes = runners[r]->kv_config().BytesPerBlock()});
  }
  std::string why;
  ASSIGN_OR_RETURN(const int64_t blocks,
                   SizeGpuKv(ranks_kv, o.kv.kv_cache_bytes,
                             o.kv.gpu_memory_utilization, o.kv.block_size,
                             /*placeholder_blocks=*/1, &why));
  // The host tier: what --cpu-offload-bytes holds for every rank.
  int64_t host_blocks = 0;
  if (o.kv.cpu_offload_bytes > 0) {
    host_blocks =
        std::numeric_limits<int32_t>::max() / o.kv.block_size - blocks;
    for (const auto& r : runners) {
      host_blocks = std::min(
          host_blocks, o.kv.cpu_offload_bytes / r->kv_config().BytesPerBlock());
    }
    absl::StrAppend(&why, "; ", std::max<int64_t>(host_blocks, 0),
                    " host-tier blocks (pinned) from --cpu-offload-bytes");
  }
  host_blocks = std::max<int64_t>(host_blocks, 0);
  for (auto& r : runners) RETURN_IF_ERROR(r->SetKvBlocks(blocks, host_blocks));
  Log("CUDA, %d rank(s) (tp %d x pp %d) on device(s) %s: "
      "weights %s (bf16), activations for %d tokens x %d "
      "sequences; %s; %lld tokens of KV",
      ranks, o.tp, o.pp, absl::StrJoin(devices, ",").c_str(),
      Gib(weight_bytes).c_str(), o.limits.max_batched_tokens, o.limits.max_seqs,
      why.c_str(), static_cast<long long>(blocks * o.kv.block_size));
  if (ranks == 1) {
    return std::unique_ptr<StepExecutor>(
        std::make_unique<CudaExecutor>(std::move(runners[0]), devices[0]));
  }

  // Ranks on threads; their communicators are in-process groups that stage
  // device tensors through the host (the ranks may share a GPU).
  InProcessComms comms = MakeInProcessComms(o.tp, o.pp, StageThroughHost);
  std::vector<std::unique_ptr<Shard>> shards;
  for (size_t r = 0; r < runners.size(); ++r) {
    runners[r]->SetComms(comms.per_rank[r]);
    shards.push_back(WrapRunner(plan.shards[r], std::move(runners[r]),
                                {.device = blocks, .host = host_blocks}));
  }
  return NewThreadedExecutor(std::move(comms.owned), std::move(shards),
                             /*threads_per_rank=*/1);
}

}  // namespace shardlm
