// Executes forward steps of a Llama model over a paged KV cache.
#ifndef SHARDLM_WORKER_MODEL_RUNNER_H_
#define SHARDLM_WORKER_MODEL_RUNNER_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "core/tensor.h"
#include "worker/kv_pool.h"
#include "worker/llama_weights.h"

namespace shardlm {

// One step: tokens of any number of sequences (prefill chunks and single
// decode tokens mixed), each written into its sequence's KV blocks.
struct StepInput {
  std::vector<int32_t> tokens;     // [n]
  std::vector<int32_t> positions;  // [n] position of each token.
  std::vector<int32_t> token_seq;  // [n] index into block_tables.
  std::vector<std::vector<int32_t>> block_tables;  // Per sequence.
  std::vector<int32_t> logit_rows;  // Token indices whose logits are wanted.
};

class ModelRunner {
 public:
  ModelRunner(LlamaWeights weights, std::unique_ptr<KvPool> kv)
      : weights_(std::move(weights)), kv_(std::move(kv)) {}

  const ModelConfig& config() const { return weights_.config; }
  const LlamaWeights& weights() const { return weights_; }
  const KvPool& kv() const { return *kv_; }

  // Runs every layer for the step's tokens and returns the logits of the
  // requested rows: [logit_rows.size(), vocab]. InvalidArgument for token
  // ids outside the vocabulary, positions beyond the context, or block
  // tables that do not cover the positions; nothing is written then.
  absl::StatusOr<Tensor> Forward(const StepInput& step);

 private:
  absl::Status Validate(const StepInput& step) const;

  LlamaWeights weights_;
  std::unique_ptr<KvPool> kv_;
};

}  // namespace shardlm

#endif  // SHARDLM_WORKER_MODEL_RUNNER_H_
