// A shard on one GPU (worker/shard.h's lifecycle with CudaModelRunner
// behind it): the in-process CUDA executor and a GPU worker (shardlm
// launch / worker --device cuda) both build theirs here. Built only with
// CUDA.
#ifndef SHARDLM_WORKER_CUDA_SHARD_H_
#define SHARDLM_WORKER_CUDA_SHARD_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "backend/device.h"
#include "model/weight_source.h"
#include "worker/cuda_model_runner.h"
#include "worker/shard.h"

namespace shardlm {

struct CudaShardOptions {
  int device = 0;  // CUDA ordinal in this process.
  // The communicators enqueue on the runner's stream (NCCL); else
  // (in-process groups that stage through the host) the stream is
  // synchronized before each collective.
  bool comms_on_stream = false;
  // --cuda-weights: how the upload holds GGUF matrices
  // (UploadLlamaWeights).
  CudaWeights cuda_weights = CudaWeights::kBf16;
};

class CudaShard : public Shard {
 public:
  // The shard's runner on its GPU, with nothing loaded yet: its stream
  // exists (a worker's NCCL groups are made on it before minutes of
  // loading, so that a missing peer fails first) and its KV pool is a
  // one-block placeholder until InitializeCache.
  static absl::StatusOr<std::unique_ptr<CudaShard>> Create(
      const ModelConfig& config, const ShardRequest& request,
      const CudaShardOptions& options);

  // The weights up once (the host copy is dropped after), then the step
  // buffers for the request's limits: what KV sizing must see.
  absl::Status Load(const WeightSource& source);

  // One collective of each kind the steps use, in the steps' order (TP:
  // all-reduce, all-gather; PP: receive from the previous stage, then send
  // to the next), so that NCCL connects its peers and allocates its
  // buffers before PlanBlocks measures free memory. Every member of the
  // groups calls it at once.
  absl::Status WarmUpCollectives(ShardComms comms);

  // What this shard alone on its GPU holds: device blocks by the request's
  // kv_cache_bytes or gpu_memory_utilization (after the weights, step
  // buffers and whatever else is on the GPU now), host-tier blocks by
  // cpu_offload_bytes. `why` (if not null) gets the arithmetic for the log.
  absl::StatusOr<KvBlockCounts> PlanBlocks(std::string* why) const;
  absl::StatusOr<KvBlockCounts> BlocksAvailable() const override {
    return PlanBlocks(nullptr);
  }
  absl::Status InitializeCache(KvBlockCounts blocks, ShardComms comms) override;

  // From Create on: the runner's CUDA stream (NCCL enqueues on it), the
  // bytes of its weights on the GPU, one KV block's bytes.
  void* stream() const;
  int64_t resident_weight_bytes() const;
  int64_t kv_block_bytes() const;
  // The KV pool's shape, and its block counts once initialized.
  const KvPoolConfig& kv_config() const;
  // The GPU it runs on.
  int device() const { return options_.device; }

 private:
  ShardRunner* runner() override {
    return initialized_ ? runner_.get() : nullptr;
  }
  const ShardRunner* runner() const override {
    return initialized_ ? runner_.get() : nullptr;
  }
  CudaShard(ShardSpec spec, ShardRequest request, CudaShardOptions options)
      : Shard(std::move(spec)),
        request_(std::move(request)),
        options_(options) {}

  const ShardRequest request_;
  const CudaShardOptions options_;
  std::unique_ptr<CudaModelRunner> runner_;
  bool loaded_ = false;
  bool initialized_ = false;
};

// Create, then Load.
absl::StatusOr<std::unique_ptr<CudaShard>> LoadCudaShard(
    const WeightSource& source, const ShardRequest& request,
    const CudaShardOptions& options);

// How many KV blocks every rank gets when ranks share GPUs: `ranks` holds
// each rank's GPU and the bytes of one of its KV blocks, measured after
// every rank's weights and activations are allocated and with each rank's
// current (placeholder) pool of `placeholder_blocks` blocks about to be
// freed. kv_cache_bytes > 0: that budget per rank; else
// gpu_memory_utilization of each GPU (PlanGpuKv), the fewest blocks any GPU
// affords. `why` gets the arithmetic for the log. InvalidArgument /
// ResourceExhausted when not one block fits.
struct GpuRankKv {
  int device = 0;
  int64_t block_bytes = 0;
};
absl::StatusOr<int64_t> SizeGpuKv(const std::vector<GpuRankKv>& ranks,
                                  int64_t kv_cache_bytes,
                                  double gpu_memory_utilization,
                                  int32_t block_size,
                                  int64_t placeholder_blocks, std::string* why);

// Host-tier blocks for `cpu_offload_bytes` per rank of `block_bytes`
// blocks (the largest any rank has), beside `device_blocks` device blocks
// (block ids and slots are int32).
int64_t HostTierBlocks(int64_t cpu_offload_bytes, int64_t block_bytes,
                       int32_t block_size, int64_t device_blocks);

}  // namespace shardlm

#endif  // SHARDLM_WORKER_CUDA_SHARD_H_
