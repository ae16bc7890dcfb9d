// Test helper: owns a test's engines and, when it closes, checks that
// every KV block came back.
#ifndef SHARDLM_ENGINE_ENGINE_LEAK_CHECK_H_
#define SHARDLM_ENGINE_ENGINE_LEAK_CHECK_H_

#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/engine.h"
#include "gtest/gtest.h"

namespace shardlm {

// Every engine a test makes is kept here, by a fixture (whose TearDown or
// destructor closes it) or by whatever else owns what the engine needs
// (a test cluster closes it before its workers stop). Close() runs
// whatever the test body did or skipped, so no workload ends without the
// check. Not thread-safe; use from the test's thread.
class EngineLeakCheck {
 public:
  EngineLeakCheck() = default;
  EngineLeakCheck(const EngineLeakCheck&) = delete;
  EngineLeakCheck& operator=(const EngineLeakCheck&) = delete;
  ~EngineLeakCheck() { Close(); }

  // Owns `engine` until Close(); returns it.
  Engine* Keep(std::unique_ptr<Engine> engine) {
    engines_.push_back(std::move(engine));
    return engines_.back().get();
  }
  // The same for a made-or-failed engine: null (and a test failure naming
  // the status) when it failed.
  Engine* Keep(absl::StatusOr<std::unique_ptr<Engine>> made) {
    if (!made.ok()) {
      ADD_FAILURE() << "Engine::Create: " << made.status();
      return nullptr;
    }
    return Keep(std::move(*made));
  }

  // Waits (at most 60 s each) for every engine to finish its requests,
  // expects all its KV blocks on both tiers to be back, then destroys the
  // engines. Later calls check nothing (there is nothing left).
  void Close() {
    for (size_t i = 0; i < engines_.size(); ++i) {
      const Engine& e = *engines_[i];
      const auto busy = [&] {
        const SchedulerStats s = e.stats();
        return s.running > 0 || s.waiting > 0 || s.steps_in_flight > 0;
      };
      const auto deadline =
          std::chrono::steady_clock::now() + std::chrono::seconds(60);
      while (busy() && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      const SchedulerStats s = e.stats();
      EXPECT_FALSE(busy()) << "engine " << i << " of the test still has "
                           << s.running << " running and " << s.waiting
                           << " waiting requests after 60 s";
      // Idle, the loop no longer touches the blocks (see Scheduler).
      EXPECT_EQ(e.blocks().used_blocks(), 0)
          << "engine " << i
          << " of the test leaked KV blocks: " << e.blocks().device_usage().used
          << " device, " << e.blocks().host_usage().used << " host";
    }
    engines_.clear();
  }

 private:
  std::vector<std::unique_ptr<Engine>> engines_;
};

}  // namespace shardlm

#endif  // SHARDLM_ENGINE_ENGINE_LEAK_CHECK_H_
