// An engine asked for a GPU: refused with the reason where there is none,
// or for what the GPU kernels do not run (backend/device.h decides).
#include <string_view>

#include "backend/device.h"
#include "engine/engine.h"
#include "executor/local_engine.h"
#include "executor/scheduler_test_util.h"
#include "gtest/gtest.h"
#include "model/in_memory_weights.h"

namespace shardlm {
namespace {

TEST(EngineDeviceTest, CudaEngineRefusesWhatGpusDoNotRunYet) {
  const ModelConfig c = TinyConfig(128);
  auto w = RandomLlamaWeights(c, 1);
  // The CUDA kernels keep the KV cache in bf16 only.
  auto f16 = CreateLocalEngine(
      *w, {.kv = {.dtype = DType::kF16}, .device = DeviceKind::kCuda});
  EXPECT_EQ(f16.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(f16.status().message().find("--kv-cache-dtype f16"),
            std::string_view::npos)
      << f16.status();
}

// Without a GPU, an engine on CUDA is refused with the reason; with one
// (a GPU machine), the same request makes an engine. Either way the case
// checks something, so it never skips.
TEST(EngineDeviceTest, CudaEngineWithoutAGpuIsFailedPrecondition) {
  const ModelConfig c = TinyConfig(128);
  auto w = RandomLlamaWeights(c, 1);
  if (QueryCuda().devices > 0) {
    auto e = CreateLocalEngine(*w, {.device = DeviceKind::kCuda});
    EXPECT_TRUE(e.ok()) << e.status();
    return;
  }
  auto e = CreateLocalEngine(*w, {.device = DeviceKind::kCuda});
  EXPECT_EQ(e.status().code(), absl::StatusCode::kFailedPrecondition)
      << e.status();
  // Sharded too: the missing GPU is the reason, not the layout.
  auto sharded =
      CreateLocalEngine(*w, {.tp = 2, .pp = 2, .device = DeviceKind::kCuda});
  EXPECT_EQ(sharded.status().code(), absl::StatusCode::kFailedPrecondition)
      << sharded.status();
}

}  // namespace
}  // namespace shardlm
