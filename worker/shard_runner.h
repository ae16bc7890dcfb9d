// What executors drive: one shard's forward steps on some backend (the CPU
// ModelRunner, the GPU CudaModelRunner), and the step accounting they share.
#ifndef SHARDLM_WORKER_SHARD_RUNNER_H_
#define SHARDLM_WORKER_SHARD_RUNNER_H_

#include <chrono>
#include <cstdint>

#include "absl/status/statusor.h"
#include "collectives/communicator.h"
#include "core/tensor.h"
#include "model/model_config.h"
#include "step/step.h"

namespace shardlm {

// Communicators of one shard; null where the group has one member.
struct ShardComms {
  Communicator* tp = nullptr;  // The TP group of this stage.
  Communicator* pp = nullptr;  // The stages of this TP index, rank = stage.
  // The CP group of this stage and TP index (rank = cp_rank): attention's
  // partial outputs are all-gathered over it (ShardForward::Layers).
  Communicator* cp = nullptr;
};

// Counts a step and adds the time until it goes out of scope to
// stats.forward_seconds.
class StepTimer {
 public:
  explicit StepTimer(RunnerStats& stats)
      : stats_(stats), start_(std::chrono::steady_clock::now()) {}
  ~StepTimer() {
    stats_.forward_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_)
            .count();
    ++stats_.steps;
  }
  StepTimer(const StepTimer&) = delete;
  StepTimer& operator=(const StepTimer&) = delete;

 private:
  RunnerStats& stats_;
  const std::chrono::steady_clock::time_point start_;
};

// One shard's forward steps on some backend; what executors drive.
class ShardRunner {
 public:
  virtual ~ShardRunner() = default;
  virtual const ModelConfig& config() const = 0;
  // Bytes of weights one step reads (the backend's dtypes).
  virtual int64_t weight_bytes() const = 0;
  // Element type of this rank's KV cache.
  virtual DType kv_dtype() const = 0;
  virtual RunnerStats stats() const = 0;
  // Runs this shard's layers for the step's tokens. On the last stage's
  // TP rank 0, returns the logits of the requested rows on the host,
  // gathered over the TP group: [logit_rows.size(), vocab]; an empty tensor
  // on other ranks. InvalidArgument for a malformed step, before anything is
  // written (every rank sees the same step, so all fail alike).
  virtual absl::StatusOr<Tensor> Forward(const StepInput& step) = 0;
  // Forward, then the step's tokens sampled from the logits (SampleStep);
  // on the shard that samples (ShardSpec::samples()). A backend may sample
  // where the logits are (the GPU runner does).
  virtual absl::StatusOr<StepOutput> Step(const StepInput& step);
};

}  // namespace shardlm

#endif  // SHARDLM_WORKER_SHARD_RUNNER_H_
