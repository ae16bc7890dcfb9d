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
#include "collectives/staged_communicator.h"
#include "coordinator/device.h"
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

absl::StatusOr<std::unique_ptr<StepExecutor>> CreateCudaExecutor(
    const WeightSource& source, const CudaExecutorOptions& o) {
  if (o.block_size <= 0 || o.kv_cache_bytes < 0 || o.max_batched_tokens <= 0 ||
      o.max_seqs <= 0 || o.tp < 1 || o.pp < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CUDA executor: block_size (", o.block_size, "), max_batched_tokens (",
        o.max_batched_tokens, "), max_seqs (", o.max_seqs, "), tp (", o.tp,
        ") and pp (", o.pp, ") must be positive, kv_cache_bytes (",
        o.kv_cache_bytes, ") not negative"));
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
                          .block_size = o.block_size,
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
    RETURN_IF_ERROR(runner->ReserveActivations(o.max_batched_tokens,
                                               std::max(o.max_seqs, 1)));
    RETURN_IF_ERROR(runner->Synchronize());
    runners.push_back(std::move(runner));
  }

  // Every rank gets the same number of blocks: the fewest any GPU holds
  // for all of its ranks.
  const int64_t max_blocks =
      std::numeric_limits<int32_t>::max() / o.block_size;  // int32 slots.
  int64_t blocks = max_blocks;
  std::string why;
  if (o.kv_cache_bytes > 0) {
    for (const auto& r : runners) {
      blocks =
          std::min(blocks, o.kv_cache_bytes / r->kv_config().BytesPerBlock());
    }
    if (blocks < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--kv-cache-bytes ", o.kv_cache_bytes, " holds no KV block of ",
          runners[0]->kv_config().BytesPerBlock(), " bytes"));
    }
    why = absl::StrCat(blocks, " KV blocks per rank from --kv-cache-bytes");
  } else {
    std::map<int, int64_t> per_device;  // Bytes of one block of each rank.
    for (size_t r = 0; r < runners.size(); ++r) {
      per_device[devices[r]] += runners[r]->kv_config().BytesPerBlock();
    }
    for (const auto& [device, block_bytes] : per_device) {
      size_t free = 0, total = 0;
      if (cudaSetDevice(device) != cudaSuccess ||
          cudaMemGetInfo(&free, &total) != cudaSuccess) {
        cudaGetLastError();
        return absl::InternalError(
            absl::StrCat("cudaMemGetInfo on CUDA device ", device, " failed"));
      }
      // The 1-block pools allocated by Create are freed before the real
      // ones.
      ASSIGN_OR_RETURN(
          GpuKvPlan plan,
          PlanGpuKv({.total_bytes = static_cast<int64_t>(total),
                     .free_bytes = static_cast<int64_t>(free) + block_bytes},
                    o.gpu_memory_utilization, block_bytes, max_blocks));
      if (plan.blocks < blocks || why.empty()) {
        blocks = plan.blocks;
        why = absl::StrCat("device ", device, ": ", plan.explanation);
      }
    }
  }
  for (auto& r : runners) RETURN_IF_ERROR(r->SetKvBlocks(blocks));
  std::fprintf(stderr,
               "shardlm: CUDA, %d rank(s) (tp %d x pp %d) on device(s) %s: "
               "weights %s (bf16), activations for %d tokens x %d "
               "sequences; %s; %lld tokens of KV\n",
               ranks, o.tp, o.pp, absl::StrJoin(devices, ",").c_str(),
               Gib(weight_bytes).c_str(), o.max_batched_tokens, o.max_seqs,
               why.c_str(), static_cast<long long>(blocks * o.block_size));
  if (ranks == 1) {
    return std::unique_ptr<StepExecutor>(
        std::make_unique<CudaExecutor>(std::move(runners[0]), devices[0]));
  }

  // Ranks on threads; their communicators are in-process groups that stage
  // device tensors through the host (the ranks may share a GPU).
  InProcessComms comms = MakeInProcessComms(o.tp, o.pp, StageThroughHost);
  std::vector<std::unique_ptr<ShardRunner>> shard_runners;
  for (size_t r = 0; r < runners.size(); ++r) {
    runners[r]->SetComms(comms.per_rank[r]);
    shard_runners.push_back(std::move(runners[r]));
  }
  return NewThreadedExecutor(std::move(comms.owned), std::move(shard_runners),
                             blocks, 0, o.tp, o.pp, /*threads_per_rank=*/1);
}

}  // namespace shardlm
