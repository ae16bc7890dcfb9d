#include "engine/step_executor.h"

#include <utility>

#include "step/kv_cache.h"

namespace shardlm {

int64_t KvBytesPerToken(const ModelConfig& c, DType dtype) {
  if (c.is_mla()) {  // One latent entry per layer, no separate V.
    return c.n_layers * KvHeadBlockBytes(dtype, 1, c.CachedHeadDim());
  }
  // A hybrid model's linear layers hold no KV (their state is per
  // sequence: KvPoolConfig::StateBytes).
  return KvBytesPerToken(c.AttentionLayers(0, c.n_layers), c.n_kv_heads,
                         c.head_dim, dtype);
}

// Out of line, and the value moved out of the StatusOr rather than the
// StatusOr itself: inlined into every executor's translation unit, gcc 12
// warned that the moved StatusOr "may be used uninitialized".
absl::Status StepExecutor::Submit(const StepInput& step) {
  submitted_.push_back(Forward(step));
  return absl::OkStatus();
}

absl::StatusOr<StepOutput> StepExecutor::Collect() {
  if (submitted_.empty()) {
    return absl::FailedPreconditionError("Collect with no step in flight");
  }
  absl::StatusOr<StepOutput>& front = submitted_.front();
  if (!front.ok()) {
    absl::Status failed = front.status();
    submitted_.pop_front();
    return failed;
  }
  StepOutput out = *std::move(front);
  submitted_.pop_front();
  return out;
}

}  // namespace shardlm
