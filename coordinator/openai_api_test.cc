// OpenAiApi pieces that the end-to-end check (tests/cli/check_http.py)
// cannot provoke on a healthy server: /ready failing when steps stall.
#include "coordinator/openai_api.h"

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "coordinator/engine_leak_check.h"
#include "coordinator/in_process_executor.h"
#include "gtest/gtest.h"
#include "model/in_memory_weights.h"

namespace shardlm {
namespace {

ModelConfig Tiny() {
  ModelConfig c;
  c.n_layers = 1;
  c.hidden = 32;
  c.ffn_hidden = 64;
  c.n_heads = 2;
  c.n_kv_heads = 1;
  c.head_dim = 16;
  c.vocab_size = 50;
  c.context_length = 64;
  return c;
}

// Holds every step until released, as a frozen rank would.
class GatedExecutor : public StepExecutor {
 public:
  explicit GatedExecutor(std::unique_ptr<StepExecutor> inner)
      : inner_(std::move(inner)) {}
  const ModelConfig& config() const override { return inner_->config(); }
  int64_t num_kv_blocks() const override { return inner_->num_kv_blocks(); }
  DType kv_cache_dtype() const override { return inner_->kv_cache_dtype(); }
  int64_t weight_bytes() const override { return inner_->weight_bytes(); }
  absl::StatusOr<StepOutput> Forward(const StepInput& step) override {
    std::unique_lock<std::mutex> lock(mu_);
    entered_ = true;
    cv_.notify_all();
    cv_.wait(lock, [&] { return open_; });
    return inner_->Forward(step);
  }
  void WaitEntered() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return entered_; });
  }
  void Open() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    cv_.notify_all();
  }

 private:
  std::unique_ptr<StepExecutor> inner_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool entered_ = false, open_ = false;
};

TEST(OpenAiApiTest, ReadyFailsWhileRequestsWaitAndNoStepRuns) {
  auto weights = RandomLlamaWeights(Tiny(), 1);
  auto inner = CreateInProcessExecutor(*weights, {});
  ASSERT_TRUE(inner.ok()) << inner.status();
  auto gated = std::make_unique<GatedExecutor>(std::move(*inner));
  GatedExecutor* gate = gated.get();
  EngineLeakCheck engines;  // Checked once the service and API are gone.
  Engine* engine = engines.Keep(Engine::Create(std::move(gated), {}));
  ASSERT_NE(engine, nullptr);
  InferenceService service(engine, nullptr, "tiny", {});
  OpenAiApi api(
      engine, &service,
      {.model_name = "tiny", .stall_timeout = absl::Milliseconds(200)});
  EXPECT_TRUE(api.Ready().ok());  // Idle is ready.

  std::atomic<bool> done{false};
  std::thread client([&] {
    auto r = engine->Generate({.prompt = {1, 2, 3}, .max_tokens = 2});
    EXPECT_TRUE(r.ok()) << r.status();
    done = true;
  });
  gate->WaitEntered();
  // The first step is stuck; the engine's figures stay put.
  absl::Status ready;
  for (int i = 0; i < 100 && ready.ok(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    ready = api.Ready();
  }
  EXPECT_EQ(ready.code(), absl::StatusCode::kUnavailable) << ready;
  EXPECT_NE(ready.message().find("no step in"), absl::string_view::npos)
      << ready;
  gate->Open();
  client.join();
  EXPECT_TRUE(done);
  EXPECT_TRUE(api.Ready().ok()) << api.Ready();
}

}  // namespace
}  // namespace shardlm
