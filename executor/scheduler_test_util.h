// Shared by the scheduler tests: a tiny random Llama, prompts, and a
// collector of on_done results.
#ifndef SHARDLM_EXECUTOR_SCHEDULER_TEST_UTIL_H_
#define SHARDLM_EXECUTOR_SCHEDULER_TEST_UTIL_H_

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <vector>

#include "engine/engine.h"
#include "engine/engine_leak_check.h"
#include "engine/scheduler.h"
#include "executor/in_process_executor.h"
#include "executor/local_engine.h"
#include "gtest/gtest.h"
#include "model/in_memory_weights.h"
#include "model/model_config.h"

namespace shardlm {

inline ModelConfig TinyConfig(int32_t context_length = 512) {
  ModelConfig c;
  c.n_layers = 3;
  c.hidden = 96;
  c.ffn_hidden = 160;
  c.n_heads = 6;
  c.n_kv_heads = 2;
  c.head_dim = 16;
  c.vocab_size = 301;
  c.context_length = context_length;
  c.rope_theta = 10000.0f;
  c.rope_style = RopeStyle::kRotateHalf;
  return c;
}

// K and V, 3 layers, 16 tokens, 2 heads of 16 values, in the default KV
// dtype (f16: 2 bytes).
constexpr int64_t kBlockBytes = 2 * 3 * 16 * 2 * 16 * 2;

inline std::vector<int32_t> Prompt(int n, int salt) {
  std::vector<int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back((i * 37 + salt * 101) % 301);
  return p;
}

// Collects on_done results of submitted requests; Wait() until all came.
class Results {
 public:
  RequestCallbacks Callbacks(size_t slot,
                             std::function<bool(int32_t)> on_token = nullptr) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (done_.size() <= slot) done_.resize(slot + 1);
      ++expected_;
    }
    RequestCallbacks cb;
    if (on_token) {
      cb.on_token = [on_token](int32_t t, const TokenLogprobs*) {
        return on_token(t) ? TokenAction::kContinue : TokenAction::kCancel;
      };
    }
    return {.on_token = std::move(cb.on_token),
            .on_done = [this, slot](absl::StatusOr<GenerateResult> r) {
              std::lock_guard<std::mutex> lock(mu_);
              done_[slot] = std::move(r);
              order_.push_back(slot);
              ++finished_;
              cv_.notify_all();
            }};
  }
  void Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    ASSERT_TRUE(cv_.wait_for(lock, std::chrono::seconds(120),
                             [&] { return finished_ == expected_; }));
  }
  const absl::StatusOr<GenerateResult>& operator[](size_t i) const {
    return *done_[i];
  }
  std::vector<size_t> order() const { return order_; }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::optional<absl::StatusOr<GenerateResult>>> done_;
  std::vector<size_t> order_;
  size_t expected_ = 0;
  size_t finished_ = 0;
};

// Runs each step at Collect instead of Submit, up to `depth` in flight: to
// the scheduler, steps in flight exactly as a pipelined cluster's, whose
// ranks also run them in submission order.
class DeferredExecutor : public StepExecutor {
 public:
  DeferredExecutor(std::unique_ptr<StepExecutor> inner, int depth)
      : inner_(std::move(inner)), depth_(depth) {}
  const ModelConfig& config() const override { return inner_->config(); }
  int64_t num_kv_blocks() const override { return inner_->num_kv_blocks(); }
  int64_t num_host_kv_blocks() const override {
    return inner_->num_host_kv_blocks();
  }
  DType kv_cache_dtype() const override { return inner_->kv_cache_dtype(); }
  int64_t weight_bytes() const override { return inner_->weight_bytes(); }
  absl::StatusOr<StepOutput> Forward(const StepInput& step) override {
    return inner_->Forward(step);
  }
  int max_steps_in_flight() const override { return depth_; }
  absl::Status Submit(const StepInput& step) override {
    EXPECT_LT(static_cast<int>(queue_.size()), depth_);
    queue_.push_back(step);
    return absl::OkStatus();
  }
  absl::StatusOr<StepOutput> Collect() override {
    EXPECT_FALSE(queue_.empty());
    StepInput step = std::move(queue_.front());
    queue_.pop_front();
    return inner_->Forward(step);
  }
  void Release(int64_t seq_id) override { inner_->Release(seq_id); }

 private:
  std::unique_ptr<StepExecutor> inner_;
  int depth_;
  std::deque<StepInput> queue_;
};

// A tiny random model with engines over it, one thread each.
class TinyEngineTest : public ::testing::Test {
 protected:
  TinyEngineTest(int32_t context_length, uint64_t seed)
      : source_(RandomLlamaWeights(TinyConfig(context_length), seed)) {}
  void TearDown() override { engines_.Close(); }
  // `steps_in_flight` > 1: over a DeferredExecutor of that depth.
  Engine* MakeEngine(EngineOptions options, int steps_in_flight = 1) {
    options.threads = 1;
    absl::StatusOr<std::unique_ptr<Engine>> e;
    if (steps_in_flight > 1) {
      auto inner = CreateInProcessExecutor(
          *source_,
          {.kv = options.kv, .limits = options.limits, .threads_per_rank = 1});
      EXPECT_TRUE(inner.ok()) << inner.status();
      if (!inner.ok()) return nullptr;
      e = Engine::Create(std::make_unique<DeferredExecutor>(std::move(*inner),
                                                            steps_in_flight),
                         options);
    } else {
      e = CreateLocalEngine(*source_, options);
    }
    return engines_.Keep(std::move(e));
  }
  std::unique_ptr<InMemoryWeights> source_;
  EngineLeakCheck engines_;
};

}  // namespace shardlm

#endif  // SHARDLM_EXECUTOR_SCHEDULER_TEST_UTIL_H_
