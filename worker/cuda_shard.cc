#include "worker/cuda_shard.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <limits>
#include <map>

#include "absl/strings/str_cat.h"
#include "backend/device.h"
#include "core/status.h"
#include "worker/llama_weights.h"

namespace shardlm {

absl::StatusOr<std::unique_ptr<CudaShard>> CudaShard::Create(
    const ModelConfig& config, const ShardRequest& request,
    const CudaShardOptions& options) {
  if (request.kv.checksum) {
    return absl::InvalidArgumentError(
        "--kv-checksum is for CPU workers: a GPU's host tier is copied by "
        "the copy engine and not checked yet");
  }
  // The cache is bf16 whatever request.kv.dtype says (the callers check
  // what they were asked for).
  const ShardSpec& spec = request.spec;
  const KvPoolConfig placeholder{.n_layers = spec.n_layers(),
                                 .kv_heads = spec.n_kv_heads(),
                                 .head_dim = config.head_dim,
                                 .block_size = request.kv.block_size,
                                 .num_blocks = 1,  // InitializeCache sizes it.
                                 .dtype = DType::kBF16};
  std::unique_ptr<CudaShard> shard(new CudaShard(spec, request, options));
  ASSIGN_OR_RETURN(shard->runner_, CudaModelRunner::Create(
                                       options.device, config, placeholder));
  return shard;
}

void* CudaShard::stream() const { return runner_->exec().stream; }

int64_t CudaShard::resident_weight_bytes() const {
  return runner_->weights().bytes();
}

int64_t CudaShard::kv_block_bytes() const {
  return runner_->kv_config().BytesPerBlock();
}

const KvPoolConfig& CudaShard::kv_config() const {
  return runner_->kv_config();
}

absl::Status CudaShard::Load(const WeightSource& source) {
  if (loaded_) return absl::FailedPreconditionError("the shard is loaded");
  RETURN_IF_ERROR(RefuseUnbuiltLayers(source.config()));
  ASSIGN_OR_RETURN(
      LlamaWeights host,
      LoadLlamaWeights(source, spec(), LogLoadProgress(request_.name)));
  ASSIGN_OR_RETURN(LlamaWeights weights,
                   UploadLlamaWeights(host, runner_->backend(), runner_->exec(),
                                      {.weights = options_.cuda_weights}));
  host = LlamaWeights();
  RETURN_IF_ERROR(runner_->SetWeights(std::move(weights)));
  RETURN_IF_ERROR(runner_->ReserveActivations(
      std::max<int32_t>(request_.limits.max_batched_tokens, 1),
      std::max<int32_t>(request_.limits.max_seqs, 1)));
  RETURN_IF_ERROR(runner_->Synchronize());
  loaded_ = true;
  return absl::OkStatus();
}

absl::Status CudaShard::WarmUpCollectives(ShardComms comms) {
  const int64_t hidden = runner_->config().hidden;
  Backend& b = runner_->backend();
  ASSIGN_OR_RETURN(Tensor x,
                   b.Allocate(DType::kF32, {hidden}, MemoryType::kDevice));
  if (comms.tp != nullptr) {
    ASSIGN_OR_RETURN(Tensor all,
                     b.Allocate(DType::kF32, {comms.tp->size() * hidden},
                                MemoryType::kDevice));
    RETURN_IF_ERROR(comms.tp->AllReduce(x, x, ReduceOp::kSum));
    RETURN_IF_ERROR(comms.tp->AllGather(x, all));
  }
  if (comms.pp != nullptr) {
    const int p = comms.pp->rank(), stages = comms.pp->size();
    if (p > 0) RETURN_IF_ERROR(comms.pp->Recv(x, p - 1));
    if (p < stages - 1) RETURN_IF_ERROR(comms.pp->Send(x, p + 1));
  }
  return runner_->Synchronize();
}

absl::StatusOr<KvBlockCounts> CudaShard::PlanBlocks(std::string* why) const {
  if (!loaded_) {
    return absl::FailedPreconditionError("KV sized before the weights loaded");
  }
  const KvCacheOptions& kv = request_.kv;
  const int64_t block_bytes = runner_->kv_config().BytesPerBlock();
  std::string text;
  ASSIGN_OR_RETURN(
      const int64_t device,
      SizeGpuKv({{.device = options_.device, .block_bytes = block_bytes}},
                kv.kv_cache_bytes, kv.gpu_memory_utilization, kv.block_size,
                /*placeholder_blocks=*/1, &text));
  const int64_t host =
      HostTierBlocks(kv.cpu_offload_bytes, block_bytes, kv.block_size, device);
  if (host > 0) {
    absl::StrAppend(&text, "; ", host,
                    " host-tier blocks (pinned) from --cpu-offload-bytes");
  }
  if (why != nullptr) *why = std::move(text);
  return KvBlockCounts{.device = device, .host = host};
}

absl::Status CudaShard::InitializeCache(KvBlockCounts blocks,
                                        ShardComms comms) {
  if (!loaded_) {
    return absl::FailedPreconditionError("KV cache before the weights");
  }
  if (initialized_) {
    return absl::FailedPreconditionError("the KV cache is set up already");
  }
  RETURN_IF_ERROR(runner_->SetKvBlocks(blocks.device, blocks.host));
  runner_->SetComms(comms, options_.comms_on_stream);
  blocks_ = blocks;
  initialized_ = true;
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<CudaShard>> LoadCudaShard(
    const WeightSource& source, const ShardRequest& request,
    const CudaShardOptions& options) {
  ASSIGN_OR_RETURN(std::unique_ptr<CudaShard> shard,
                   CudaShard::Create(source.config(), request, options));
  RETURN_IF_ERROR(shard->Load(source));
  return shard;
}

int64_t HostTierBlocks(int64_t cpu_offload_bytes, int64_t block_bytes,
                       int32_t block_size, int64_t device_blocks) {
  if (cpu_offload_bytes <= 0 || block_bytes <= 0 || block_size <= 0) return 0;
  return std::clamp<int64_t>(
      cpu_offload_bytes / block_bytes, 0,
      std::max<int64_t>(
          std::numeric_limits<int32_t>::max() / block_size - device_blocks, 0));
}

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

}  // namespace shardlm
