// Engine: a model, its KV cache and a block manager in one process, with a
// scheduler loop that batches sequences (continuous batching, chunked
// prefill). The cluster splits the same roles across ranks: the block
// manager and scheduling stay in the coordinator, the ModelRunner moves to
// the workers.
#ifndef SHARDLM_COORDINATOR_ENGINE_H_
#define SHARDLM_COORDINATOR_ENGINE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/block_manager.h"
#include "coordinator/step_executor.h"
#include "kernels/sampling/sampling.h"
#include "model/weight_source.h"
#include "worker/model_runner.h"

namespace shardlm {

struct EngineOptions {
  // KV cache budget; 0 sizes it for one sequence of the full context.
  int64_t kv_cache_bytes = 0;
  int32_t block_size = 16;
  // Most tokens in one step; longer prompts are prefilled in chunks.
  int32_t max_batched_tokens = 512;
  int threads = 0;  // CPU threads; 0 means all cores.
  // Tensor and pipeline parallel degrees. tp * pp > 1 runs the shards on
  // threads of this process (the cluster runs them on worker ranks).
  int tp = 1;
  int pp = 1;
};

struct GenerateRequest {
  std::vector<int32_t> prompt;  // Token ids; at least one.
  int32_t max_tokens = 16;
  SamplingParams sampling;
  std::vector<int32_t> stop_token_ids;  // Generation ends after one of these.
  bool return_prompt_logits = false;    // Logits at the last prompt position.
};

enum class FinishReason { kLength, kStop, kCancelled };
const char* FinishReasonName(FinishReason r);

struct GenerateResult {
  std::vector<int32_t> tokens;  // Generated tokens (including a stop token).
  FinishReason finish_reason = FinishReason::kLength;
  std::vector<float> prompt_logits;  // When asked for: [vocab].
  double prefill_seconds = 0;        // Until the first generated token.
  double decode_seconds = 0;         // From the first to the last token.
};

// Called with (request index, token) as each token is produced; returning
// false cancels that request.
using TokenCallback = std::function<bool(size_t, int32_t)>;

class Engine {
 public:
  static absl::StatusOr<std::unique_ptr<Engine>> Create(
      const WeightSource& source, const EngineOptions& options);
  // An engine over an executor built elsewhere (e.g. remote workers).
  static absl::StatusOr<std::unique_ptr<Engine>> Create(
      std::unique_ptr<StepExecutor> executor, const EngineOptions& options);

  const ModelConfig& config() const { return executor_->config(); }
  const BlockManager& blocks() const { return blocks_; }
  const StepExecutor& executor() const { return *executor_; }

  // Runs the requests together until each finishes. Requests are checked
  // up front (InvalidArgument naming the request and field; nothing runs
  // then). A request whose prompt plus max_tokens can never fit in the KV
  // cache is InvalidArgument with the numbers. Every block is returned
  // before this returns, also on error.
  absl::StatusOr<std::vector<GenerateResult>> GenerateBatch(
      const std::vector<GenerateRequest>& requests,
      const TokenCallback& on_token = nullptr);
  absl::StatusOr<GenerateResult> Generate(
      const GenerateRequest& request,
      const std::function<bool(int32_t)>& on_token = nullptr);

 private:
  Engine(std::unique_ptr<StepExecutor> executor, BlockManager blocks,
         EngineOptions options)
      : executor_(std::move(executor)),
        blocks_(std::move(blocks)),
        options_(options) {}
  absl::Status Validate(const std::vector<GenerateRequest>& requests) const;

  std::unique_ptr<StepExecutor> executor_;
  BlockManager blocks_;
  EngineOptions options_;
  int64_t next_seq_id_ = 0;
};

}  // namespace shardlm

#endif  // SHARDLM_COORDINATOR_ENGINE_H_
