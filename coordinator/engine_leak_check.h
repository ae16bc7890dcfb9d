// Test helper: keeps a test's engines alive until its TearDown, which
// checks that every KV block came back.
#ifndef SHARDLM_COORDINATOR_ENGINE_LEAK_CHECK_H_
#define SHARDLM_COORDINATOR_ENGINE_LEAK_CHECK_H_

#include <memory>
#include <vector>

#include "coordinator/engine.h"
#include "gtest/gtest.h"

namespace shardlm {

// Engines made by a test live until its end, when every one must have
// all its KV blocks back (no workload may leak one, whatever it checks
// itself).
class EngineLeakCheck {
 public:
  Engine* Keep(std::unique_ptr<Engine> engine) {
    engines_.push_back(std::move(engine));
    return engines_.back().get();
  }
  void ExpectNoBlockInUse() const {
    for (size_t i = 0; i < engines_.size(); ++i) {
      EXPECT_EQ(engines_[i]->blocks().used_blocks(), 0)
          << "engine " << i << " of the test leaked KV blocks";
    }
  }

 private:
  std::vector<std::unique_ptr<Engine>> engines_;
};

}  // namespace shardlm

#endif  // SHARDLM_COORDINATOR_ENGINE_LEAK_CHECK_H_
