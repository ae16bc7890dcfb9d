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
#include "worker/forward.h"
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
  std::vector<int64_t> seq_ids;  // Per sequence: the engine's sequence id.
  // KV block copies (tier swaps, cache spills) run in order before the
  // step's compute, on every rank over its own slice.
  std::vector<BlockCopy> copies;
  // Rows whose next token is sampled: token index, sampling parameters,
  // and the index of the token being generated (the sampling draw).
  std::vector<int32_t> logit_rows;
  std::vector<SamplingParams> sampling;
  std::vector<uint64_t> sample_index;
  bool return_logits = false;  // Also return the logits of logit_rows.
  // Empty, or per logit row: how many most likely alternatives to report
  // with the sampled token's log-probability (0: no log-probabilities for
  // that row; at most kMaxLogprobs).
  std::vector<int32_t> logprobs;
};

// Most alternatives a row may ask for (as OpenAI's API).
inline constexpr int32_t kMaxLogprobs = 20;

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0;
};

// Log-probabilities of one sampled token under the model's distribution:
// log_softmax of the raw logits (temperature 1, before top-k and top-p),
// computed in double, whatever the row's sampling parameters.
struct TokenLogprobs {
  float sampled = 0;              // Of the sampled token.
  std::vector<TokenLogprob> top;  // Most likely first (lower id on ties).
};

struct StepOutput {
  std::vector<int32_t> tokens;  // One per logit row.
  Tensor logits;                // [rows, vocab] when return_logits, else empty.
  // One per logit row when any row asked for log-probabilities (rows that
  // did not have an empty entry), else empty.
  std::vector<TokenLogprobs> logprobs;
};

// The log-probabilities of `sampled` and of the `top_n` most likely tokens
// under one row of logits ([vocab]).
TokenLogprobs Logprobs(absl::Span<const float> logits, int32_t sampled,
                       int32_t top_n);

// Samples one token per logit row of `logits` ([rows, vocab]) with the
// step's per-row parameters, and computes the log-probabilities asked for.
absl::StatusOr<StepOutput> SampleStep(const StepInput& step, Tensor logits);

// Where a runner's time went, cumulative.
struct RunnerStats {
  int64_t steps = 0;
  double forward_seconds = 0;  // Inside Forward().
  // Inside communicator calls; includes waiting for peers (a slower TP
  // rank, or the previous stage for PP), which is what it costs a step.
  double comm_seconds = 0;
  int64_t copied_blocks = 0;  // KV block copies run (swaps, spills).
  double copy_seconds = 0;    // Inside them.
  int cpu_threads = 0;  // OpenMP threads the last step's kernels could use.
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
  virtual RunnerStats stats() const = 0;
  // Runs this shard's layers for the step's tokens. On the last stage,
  // returns the logits of the requested rows on the host, gathered over
  // the TP group: [logit_rows.size(), vocab]; an empty tensor on other
  // stages. InvalidArgument for a malformed step, before anything is
  // written (every rank sees the same step, so all fail alike).
  virtual absl::StatusOr<Tensor> Forward(const StepInput& step) = 0;
};

// Runs one shard (weights.spec) on the CPU: its layers, with its heads and FFN
// columns (TP partial sums all-reduced over comms.tp), receiving hidden states
// from the previous stage and sending them to the next (comms.pp). Every rank
// of the cluster is given the same StepInput.
class ModelRunner : public ShardRunner {
 public:
  ModelRunner(LlamaWeights weights, std::unique_ptr<KvPool> kv,
              ShardComms comms = {})
      : weights_(std::move(weights)), kv_(std::move(kv)), comms_(comms) {}

  const ModelConfig& config() const override { return weights_.config; }
  int64_t weight_bytes() const override { return weights_.bytes(); }
  RunnerStats stats() const override { return stats_; }
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
