// NewCudaShardHost in a binary built without CUDA or NCCL.
#include "absl/strings/str_cat.h"
#include "launch/cuda_shard_host.h"

namespace shardlm {

absl::StatusOr<std::unique_ptr<ShardHost>> NewCudaShardHost(
    const WeightSource*, const CudaShardHostOptions& options) {
  return absl::FailedPreconditionError(absl::StrCat(
      "worker rank ", options.rank,
      ": this shardlm was built without CUDA and NCCL (SHARDLM_CUDA=OFF, no "
      "nvcc, or no NCCL); GPU workers need both"));
}

absl::StatusOr<std::string> GpuUuid(int) {
  return absl::FailedPreconditionError("this shardlm was built without CUDA");
}

}  // namespace shardlm
