// A worker's shard on one GPU (shardlm launch / shardlm worker with
// --device cuda): its slice of the weights in bf16, its KV pool in the
// GPU's memory (sized from --gpu-memory-utilization after the weights and
// activation buffers, or from --kv-cache-bytes), and NCCL communicators for
// its TP group and PP chain. Each group's rank 0 makes the group's NCCL
// unique id (it embeds that process's bootstrap address) and publishes it
// through the coordinator's rendezvous store; the others read it there
// (AgreeOnGroupId). NCCL init and every collective have the given timeout.
//
// CUDA-free header; in a binary built without CUDA (or NCCL) the factory
// says so.
#ifndef SHARDLM_WORKER_CUDA_SHARD_HOST_H_
#define SHARDLM_WORKER_CUDA_SHARD_HOST_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/time/time.h"
#include "backend/device.h"
#include "collectives/rendezvous_store.h"
#include "model/weight_source.h"
#include "worker/worker_agent.h"

namespace shardlm {

struct CudaShardHostOptions {
  int device = 0;  // CUDA ordinal in this process.
  int rank = 0;    // The worker's rank, 1 .. tp * pp (messages).
  // Where the NCCL ids of the shard's groups meet (the coordinator's
  // store); outlives the host.
  RendezvousStore* store = nullptr;
  // NCCL init (waiting for the group), the rendezvous, every collective.
  absl::Duration timeout = absl::Seconds(300);
  // --cuda-weights: how the shard's upload holds GGUF matrices.
  CudaWeights cuda_weights = CudaWeights::kBf16;
};

// Whether this binary has GPU workers (CUDA and NCCL).
bool GpuWorkersBuilt();

// The host of one GPU worker. FailedPrecondition when this binary has no
// CUDA or no NCCL; Load's errors name the rank, its device and the group.
absl::StatusOr<std::unique_ptr<ShardHost>> NewCudaShardHost(
    const WeightSource* source, const CudaShardHostOptions& options);

// What a CUDA worker reports at registration: its device's UUID.
absl::StatusOr<std::string> GpuUuid(int device);

// The rendezvous key of a shard's NCCL group (ShardGroup::name), e.g.
// `<prefix>/nccl/tp-group-of-stage-0`.
inline std::string NcclGroupKey(const std::string& prefix,
                                const std::string& group) {
  return absl::StrCat(prefix, "/nccl/",
                      absl::StrReplaceAll(group, {{" ", "-"}}));
}

}  // namespace shardlm

#endif  // SHARDLM_WORKER_CUDA_SHARD_HOST_H_
