// NewCudaShardHost in a binary built without CUDA, or with CUDA but without
// NCCL (GPU workers need both; generate/serve on GPUs need only CUDA).
#include "absl/strings/str_cat.h"
#include "worker/cuda_shard_host.h"

namespace shardlm {

bool GpuWorkersBuilt() { return false; }

absl::StatusOr<std::unique_ptr<ShardHost>> NewCudaShardHost(
    const WeightSource*, const CudaShardHostOptions& options) {
  return absl::FailedPreconditionError(absl::StrCat(
      "worker rank ", options.rank,
      ": this shardlm has no GPU workers: it was built without CUDA "
      "(SHARDLM_CUDA=OFF or no nvcc) or without NCCL; they need both"));
}

absl::StatusOr<std::string> GpuUuid(int) {
  return absl::FailedPreconditionError("this shardlm was built without CUDA");
}

}  // namespace shardlm
