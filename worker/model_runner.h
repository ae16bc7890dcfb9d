// Executes forward steps of a Llama model over a paged KV cache.
#ifndef SHARDLM_WORKER_MODEL_RUNNER_H_
#define SHARDLM_WORKER_MODEL_RUNNER_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "collectives/communicator.h"
#include "core/tensor.h"
#include "kernels/sampling/sampling.h"
#include "step/step.h"
#include "worker/forward.h"
#include "worker/kv_pool.h"
#include "worker/llama_weights.h"
#include "worker/shard_runner.h"

namespace shardlm {

// Runs one shard (weights.spec) on the CPU: its layers, with its heads and FFN
// columns (TP partial sums all-reduced over comms.tp), receiving hidden states
// from the previous stage and sending them to the next (comms.pp). Every rank
// of the cluster is given the same StepInput.
//
// Context parallel (weights.spec.cp_size = C > 1, comms.cp set): block ids
// in a step are the CP group's, C times as many as this rank's pool holds;
// id g lives on CP rank g % C, in slot g / C of that rank's pool. This rank
// writes the K/V of the tokens in its blocks only and attends over them
// (the parts are merged over comms.cp: ShardForward). A step of n >= C
// tokens is run sequence parallel: this rank runs tokens [c n / C, (c + 1)
// n / C) through the projections and MLP (SequenceParallel; counted in
// stats().token_rows), a shorter one whole. Tier copies must stay on one
// rank (both ids held by the same CP rank).
class ModelRunner : public ShardRunner {
 public:
  ModelRunner(LlamaWeights weights, std::unique_ptr<KvPool> kv,
              ShardComms comms = {})
      : weights_(std::move(weights)), kv_(std::move(kv)), comms_(comms) {}
  // The weights alone: SetKv before the first step.
  explicit ModelRunner(LlamaWeights weights) : weights_(std::move(weights)) {}
  void SetKv(std::unique_ptr<KvPool> kv) { kv_ = std::move(kv); }
  void SetComms(ShardComms comms) { comms_ = comms; }

  const ModelConfig& config() const override { return weights_.config; }
  int64_t weight_bytes() const override { return weights_.bytes(); }
  DType kv_dtype() const override { return kv_->config().dtype; }
  RunnerStats stats() const override;
  const LlamaWeights& weights() const { return weights_; }
  const KvPool& kv() const { return *kv_; }
  // CPU threads this runner's kernels use, on whichever thread calls
  // Forward (OpenMP's setting is per thread); 0 leaves the caller's.
  void set_cpu_threads(int n) { cpu_threads_ = n; }

  // Runs this shard's layers for the step's tokens. On the last stage,
  // returns the logits of the requested rows, gathered over the TP group:
  // [logit_rows.size(), vocab]; an empty tensor on other stages.
  // InvalidArgument for token ids outside the vocabulary, positions beyond
  // the context, or block tables that do not cover the positions; nothing
  // is written then (every rank sees the same step, so all fail alike).
  absl::StatusOr<Tensor> Forward(const StepInput& step) override;

 private:
  absl::Status Validate(const StepInput& step) const;
  // Runs a communicator call, adding its time to stats_.comm_seconds.
  template <typename F>
  absl::Status Comm(F&& call) {
    const auto start = std::chrono::steady_clock::now();
    absl::Status s = call();
    stats_.comm_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
    return s;
  }

  LlamaWeights weights_;
  std::unique_ptr<KvPool> kv_;
  ShardComms comms_;
  RunnerStats stats_;
  int cpu_threads_ = 0;
};

}  // namespace shardlm

#endif  // SHARDLM_WORKER_MODEL_RUNNER_H_
