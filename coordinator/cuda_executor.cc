// The one-GPU StepExecutor over CudaModelRunner (built only with CUDA; see
// cuda_executor_stub.cc for binaries without it).
#include "coordinator/cuda_executor.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "backend/cuda_backend.h"
#include "coordinator/device.h"
#include "core/status.h"
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

class CudaExecutor : public StepExecutor {
 public:
  explicit CudaExecutor(std::unique_ptr<CudaModelRunner> runner)
      : runner_(std::move(runner)) {}
  const ModelConfig& config() const override {
    return runner_->weights().config;
  }
  int64_t num_kv_blocks() const override {
    return runner_->kv_config().num_blocks;
  }
  // bf16 bytes on the device (not the f32 bytes of the CPU runner).
  int64_t weight_bytes() const override {
    return runner_->weights().bytes_per_step();
  }
  std::vector<RunnerStats> RankStats() const override { return {stats_}; }
  absl::StatusOr<StepOutput> Forward(const StepInput& step) override {
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<StepOutput> out = runner_->Step(step);
    stats_.forward_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
    ++stats_.steps;
    return out;
  }

 private:
  std::unique_ptr<CudaModelRunner> runner_;
  RunnerStats stats_;
};

std::string Gib(int64_t bytes) {
  return absl::StrFormat("%.2f GiB", static_cast<double>(bytes) / (1 << 30));
}

}  // namespace

absl::StatusOr<std::unique_ptr<StepExecutor>> CreateCudaExecutor(
    const WeightSource& source, const CudaExecutorOptions& o) {
  if (o.block_size <= 0 || o.kv_cache_bytes < 0 || o.max_batched_tokens <= 0 ||
      o.max_seqs <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CUDA executor: block_size (", o.block_size, "), max_batched_tokens (",
        o.max_batched_tokens, ") and max_seqs (", o.max_seqs,
        ") must be positive, kv_cache_bytes (", o.kv_cache_bytes,
        ") not negative"));
  }
  ASSIGN_OR_RETURN(LlamaWeights host, LoadLlamaWeights(source));
  const ModelConfig c = host.config;  // A copy: `host` is dropped below.
  KvPoolConfig kv{.n_layers = c.n_layers,
                  .kv_heads = c.n_kv_heads,
                  .head_dim = c.head_dim,
                  .block_size = o.block_size,
                  .num_blocks = 1};  // Sized below, once the weights are in.
  ASSIGN_OR_RETURN(std::unique_ptr<CudaModelRunner> runner,
                   CudaModelRunner::Create(o.device, c, kv));
  ASSIGN_OR_RETURN(LlamaWeights weights,
                   UploadLlamaWeights(host, runner->backend(), runner->exec()));
  host = LlamaWeights();  // The f32 host copy is not needed any more.
  const int64_t weight_bytes = weights.bytes();
  runner->SetWeights(std::move(weights));
  RETURN_IF_ERROR(runner->ReserveActivations(o.max_batched_tokens,
                                             std::max(o.max_seqs, 1)));
  RETURN_IF_ERROR(runner->Synchronize());

  // bf16 K and V of every layer.
  const int64_t block_bytes =
      2 * c.n_layers * o.block_size * c.n_kv_heads * c.head_dim * 2;
  // Block ids and KV slots (block * block_size + offset) are int32.
  const int64_t max_blocks = std::numeric_limits<int32_t>::max() / o.block_size;
  int64_t blocks = 0;
  std::string why;
  if (o.kv_cache_bytes > 0) {
    blocks = std::min(o.kv_cache_bytes / block_bytes, max_blocks);
    if (blocks < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("--kv-cache-bytes ", o.kv_cache_bytes,
                       " holds no KV block of ", block_bytes, " bytes"));
    }
    why = absl::StrCat(blocks, " KV blocks from --kv-cache-bytes");
  } else {
    size_t free = 0, total = 0;
    if (cudaMemGetInfo(&free, &total) != cudaSuccess) {
      cudaGetLastError();
      return absl::InternalError("cudaMemGetInfo failed");
    }
    // The 1-block pool allocated by Create is freed before the real one.
    ASSIGN_OR_RETURN(
        GpuKvPlan plan,
        PlanGpuKv({.total_bytes = static_cast<int64_t>(total),
                   .free_bytes = static_cast<int64_t>(free) + block_bytes},
                  o.gpu_memory_utilization, block_bytes, max_blocks));
    blocks = plan.blocks;
    why = plan.explanation;
  }
  RETURN_IF_ERROR(runner->SetKvBlocks(blocks));
  std::fprintf(stderr,
               "shardlm: CUDA device %d: weights %s (bf16), activations for "
               "%d tokens x %d sequences; %s; %lld tokens of KV\n",
               o.device, Gib(weight_bytes).c_str(), o.max_batched_tokens,
               o.max_seqs, why.c_str(),
               static_cast<long long>(blocks * o.block_size));
  return std::unique_ptr<StepExecutor>(
      std::make_unique<CudaExecutor>(std::move(runner)));
}

}  // namespace shardlm
