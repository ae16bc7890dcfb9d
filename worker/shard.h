// One shard's lifecycle, written once for every place that runs one (the
// in-process executors' threads, a worker under mpirun or in a pod): load
// its weights, say how many KV blocks its budget holds, allocate the block
// counts every rank of the cluster agrees on (the fewest any rank holds, so
// that a block id means the same slot everywhere), then run steps. As
// vLLM's worker: load_model, determine_available_memory, initialize_cache,
// execute_model.
#ifndef SHARDLM_WORKER_SHARD_H_
#define SHARDLM_WORKER_SHARD_H_

#include <cstdint>
#include <limits>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "model/shard_plan.h"
#include "model/weight_source.h"
#include "step/batch_limits.h"
#include "step/kv_cache.h"
#include "step/step.h"
#include "worker/shard_runner.h"

namespace shardlm {

// What one shard is asked to be.
struct ShardRequest {
  ShardSpec spec;  // From PlanShards(): which layers, heads, columns.
  KvCacheOptions kv;
  BatchLimits limits;
  int threads = 0;   // CPU threads its steps use; 0: the caller's setting.
  std::string name;  // Who loads, for the load log ("shard pp 0 tp 1").
};

// KV blocks in each tier.
struct KvBlockCounts {
  int64_t device = 0;
  int64_t host = 0;

  // The fewest of each tier (what every rank of a cluster can hold).
  KvBlockCounts Min(const KvBlockCounts& o) const {
    return {std::min(device, o.device), std::min(host, o.host)};
  }
  static KvBlockCounts Unbounded() {
    return {std::numeric_limits<int64_t>::max(),
            std::numeric_limits<int64_t>::max()};
  }
};

class Shard {
 public:
  virtual ~Shard() = default;

  const ShardSpec& spec() const { return spec_; }
  // The blocks its KV budget holds in each tier (after Load: the weights
  // and step buffers are in place). InvalidArgument when the budget holds
  // no device block.
  virtual absl::StatusOr<KvBlockCounts> BlocksAvailable() const = 0;
  // Allocates the KV cache with `blocks` (each at most BlocksAvailable()'s)
  // and joins the shard's TP group and PP chain (null: a group of one).
  // Once; steps may run after it.
  virtual absl::Status InitializeCache(KvBlockCounts blocks,
                                       ShardComms comms) = 0;
  // Whether InitializeCache has run (steps may run).
  bool initialized() const { return runner() != nullptr; }
  // The model, its KV cache's element type, the bytes of weights one step
  // reads and the step figures, once initialized (a CHECK before): what
  // executors and shard hosts report, so that none reaches the runner.
  const ModelConfig& config() const { return initialized_runner().config(); }
  DType kv_dtype() const { return initialized_runner().kv_dtype(); }
  int64_t weight_bytes() const { return initialized_runner().weight_bytes(); }
  RunnerStats stats() const { return initialized_runner().stats(); }
  // The blocks allocated (zero before InitializeCache).
  KvBlockCounts blocks() const { return blocks_; }

  // Runs the step: every rank checks the step's sampling part first (a
  // malformed step is refused alike everywhere, before any collective);
  // the sampling shard (ShardSpec::samples()) returns the sampled tokens,
  // the others an empty output.
  absl::StatusOr<StepOutput> Step(const StepInput& step);

 protected:
  explicit Shard(ShardSpec spec) : spec_(std::move(spec)) {}
  // The runner (null before InitializeCache); private to worker/.
  virtual ShardRunner* runner() = 0;
  virtual const ShardRunner* runner() const = 0;
  KvBlockCounts blocks_;

 private:
  const ShardRunner& initialized_runner() const;

  ShardSpec spec_;
};

// Loads a shard's weights on the CPU, in their file formats.
absl::StatusOr<std::unique_ptr<Shard>> LoadCpuShard(const WeightSource& source,
                                                    const ShardRequest& r);

}  // namespace shardlm

#endif  // SHARDLM_WORKER_SHARD_H_
