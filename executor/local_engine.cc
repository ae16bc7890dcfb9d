#include "executor/local_engine.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "executor/cuda_executor.h"
#include "executor/in_process_executor.h"
#include "kernels/threading.h"

namespace shardlm {

absl::StatusOr<std::unique_ptr<StepExecutor>> MakeExecutor(
    const WeightSource& source, const EngineOptions& options) {
  RETURN_IF_ERROR(options.Validate());
  const KvCacheOptions& kv = options.kv;
  SetCpuThreads(options.threads);
  if (options.device == DeviceKind::kCuda) {
    if (options.cp > 1) {
      return absl::UnimplementedError(
          absl::StrCat("--cp ", options.cp,
                       " on CUDA: context parallelism is built for the CPU "
                       "path only so far; use --cp 1, or --device cpu"));
    }
    if (kv.dtype.value_or(DType::kBF16) != DType::kBF16) {
      return absl::UnimplementedError(absl::StrCat(
          "--kv-cache-dtype ", KvCacheDTypeName(*kv.dtype),
          " on CUDA: the GPU kernels keep the KV cache in bf16 only; use "
          "bf16 (the default there), or --device cpu"));
    }
    return CreateCudaExecutor(source,
                              {.kv = kv,
                               .limits = options.limits,
                               .device = options.device_ordinal,
                               .tp = options.tp,
                               .pp = options.pp,
                               .pp_balance = options.pp_balance,
                               .allow_shared_gpu = options.allow_shared_gpu,
                               .cuda_weights = options.cuda_weights});
  }
  // Ranks on threads share the cores.
  const int ranks = options.tp * options.pp * options.cp;
  return CreateInProcessExecutor(
      source, {.kv = kv,
               .limits = options.limits,
               .tp = options.tp,
               .pp = options.pp,
               .cp = options.cp,
               .moe_sharding = options.moe_sharding,
               .pp_balance = options.pp_balance,
               .threads_per_rank = std::max(1, CpuThreads() / ranks)});
}

absl::StatusOr<std::unique_ptr<Engine>> CreateLocalEngine(
    const WeightSource& source, const EngineOptions& options) {
  ASSIGN_OR_RETURN(std::unique_ptr<StepExecutor> executor,
                   MakeExecutor(source, options));
  return Engine::Create(std::move(executor), options);
}

}  // namespace shardlm
