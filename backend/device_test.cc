// --device parsing and choice, and the GPU KV sizing arithmetic; without a
// GPU (engine/engine_device_test.cc: an engine asked for CUDA).
#include "backend/device.h"

#include <gtest/gtest.h>

#include <cmath>

namespace shardlm {
namespace {

TEST(DeviceFlagTest, ParsesEveryForm) {
  auto a = ParseDeviceFlag("auto");
  ASSERT_TRUE(a.ok());
  EXPECT_TRUE(a->automatic);
  auto c = ParseDeviceFlag("cpu");
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(c->automatic);
  EXPECT_EQ(c->kind, DeviceKind::kCpu);
  auto g = ParseDeviceFlag("cuda");
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->kind, DeviceKind::kCuda);
  EXPECT_EQ(g->ordinal, 0);
  auto g3 = ParseDeviceFlag("cuda:3");
  ASSERT_TRUE(g3.ok());
  EXPECT_EQ(g3->kind, DeviceKind::kCuda);
  EXPECT_EQ(g3->ordinal, 3);
  for (const char* bad : {"", "gpu", "CUDA", "cuda:", "cuda:-1", "cuda:1x",
                          "cuda:+1", "cuda: 1", "cuda:99999999999", "cpu:0"}) {
    SCOPED_TRACE(bad);
    auto r = ParseDeviceFlag(bad);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("--device"), std::string_view::npos);
  }
}

TEST(CudaWeightsFlagTest, ParsesBothFormsAndNamesTheFlag) {
  EXPECT_EQ(*ParseCudaWeights("bf16"), CudaWeights::kBf16);
  EXPECT_EQ(*ParseCudaWeights("quantized"), CudaWeights::kQuantized);
  EXPECT_STREQ(CudaWeightsName(CudaWeights::kQuantized), "quantized");
  EXPECT_STREQ(CudaWeightsName(CudaWeights::kBf16), "bf16");
  for (const char* bad : {"", "BF16", "q8_0", "quant"}) {
    const auto r = ParseCudaWeights(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("--cuda-weights"), std::string::npos);
  }
}

TEST(DeviceChoiceTest, AutoTakesAGpuOnlyWhenOneIsUsable) {
  const DeviceRequest automatic;
  const CudaAvailability two_gpus{.built_with_cuda = true, .devices = 2};
  const CudaAvailability no_driver{.built_with_cuda = true,
                                   .why_none = "no CUDA device: no driver"};
  const CudaAvailability cpu_build{};

  auto gpu = ChooseDevice(automatic, two_gpus);
  ASSERT_TRUE(gpu.ok());
  EXPECT_EQ(gpu->kind, DeviceKind::kCuda);
  EXPECT_EQ(gpu->ordinal, 0);

  auto cpu = ChooseDevice(automatic, no_driver);
  ASSERT_TRUE(cpu.ok());
  EXPECT_EQ(cpu->kind, DeviceKind::kCpu);
  EXPECT_NE(cpu->reason.find("no driver"), std::string::npos) << cpu->reason;

  cpu = ChooseDevice(automatic, cpu_build);
  ASSERT_TRUE(cpu.ok());
  EXPECT_EQ(cpu->kind, DeviceKind::kCpu);
  EXPECT_NE(cpu->reason.find("without CUDA"), std::string::npos);

  // A configuration GPUs do not run yet keeps auto on the CPU.
  cpu = ChooseDevice(automatic, two_gpus, "--tp/--pp > 1");
  ASSERT_TRUE(cpu.ok());
  EXPECT_EQ(cpu->kind, DeviceKind::kCpu);
  EXPECT_NE(cpu->reason.find("--tp/--pp > 1"), std::string::npos);
}

TEST(DeviceChoiceTest, ExplicitCudaFailsSayingWhy) {
  const CudaAvailability two_gpus{.built_with_cuda = true, .devices = 2};
  const DeviceRequest cuda1{
      .automatic = false, .kind = DeviceKind::kCuda, .ordinal = 1};
  auto ok = ChooseDevice(cuda1, two_gpus);
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->ordinal, 1);

  const DeviceRequest cuda2{
      .automatic = false, .kind = DeviceKind::kCuda, .ordinal = 2};
  auto out_of_range = ChooseDevice(cuda2, two_gpus);
  EXPECT_EQ(out_of_range.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(out_of_range.status().message().find("only 2"),
            std::string_view::npos);

  const DeviceRequest cuda{.automatic = false, .kind = DeviceKind::kCuda};
  auto none = ChooseDevice(
      cuda, {.built_with_cuda = true, .why_none = "cudaErrorNoDevice"});
  EXPECT_EQ(none.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(none.status().message().find("cudaErrorNoDevice"),
            std::string_view::npos);
  auto cpu_build = ChooseDevice(cuda, {});
  EXPECT_EQ(cpu_build.status().code(), absl::StatusCode::kFailedPrecondition);

  const DeviceRequest cpu{.automatic = false, .kind = DeviceKind::kCpu};
  auto c = ChooseDevice(cpu, two_gpus);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->kind, DeviceKind::kCpu);
}

TEST(GpuKvPlanTest, TheRestOfTheFractionBecomesBlocks) {
  const int64_t gib = int64_t{1} << 30;
  // 80 GiB card, 10 GiB in use: 0.9 * 80 - 10 - margin.
  auto plan = PlanGpuKv({.total_bytes = 80 * gib, .free_bytes = 70 * gib}, 0.90,
                        /*block_bytes=*/1 << 20, /*max_blocks=*/1 << 30);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const int64_t want = (72 * gib - 10 * gib - kGpuMemoryMargin) >> 20;
  EXPECT_EQ(plan->blocks, want);
  EXPECT_EQ(plan->budget_bytes, 72 * gib - 10 * gib - kGpuMemoryMargin);
  EXPECT_NE(plan->explanation.find("0.9 x 80.00 GiB"), std::string::npos)
      << plan->explanation;

  // Capped.
  plan = PlanGpuKv({.total_bytes = 80 * gib, .free_bytes = 70 * gib}, 0.5,
                   1 << 20, 1000);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->blocks, 1000);
  EXPECT_NE(plan->explanation.find("capped at 1000"), std::string::npos);

  // Other processes use most of the card: nothing fits.
  auto full = PlanGpuKv({.total_bytes = 80 * gib, .free_bytes = 8 * gib}, 0.90,
                        1 << 20, 1 << 30);
  EXPECT_EQ(full.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(full.status().message().find("--gpu-memory-utilization"),
            std::string_view::npos);

  for (double bad : {0.0, -0.5, 1.01, std::nan("")}) {
    auto r = PlanGpuKv({.total_bytes = 80 * gib, .free_bytes = 70 * gib}, bad,
                       1 << 20, 1 << 30);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  auto inconsistent = PlanGpuKv({.total_bytes = gib, .free_bytes = 2 * gib},
                                0.9, 1 << 20, 1 << 30);
  EXPECT_EQ(inconsistent.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(DeviceChoiceTest, RanksTakeOneGpuEachUnlessSharingIsAllowed) {
  auto four = AssignGpus(4, 4, false);
  ASSERT_TRUE(four.ok());
  EXPECT_EQ(*four, (std::vector<int>{0, 1, 2, 3}));
  auto shared = AssignGpus(4, 1, false);
  EXPECT_EQ(shared.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(shared.status().message().find("ranks 0 and 1"),
            std::string_view::npos)
      << shared.status();
  EXPECT_NE(shared.status().message().find("--allow-shared-gpu"),
            std::string_view::npos);
  auto three_on_two = AssignGpus(3, 2, false);
  EXPECT_NE(three_on_two.status().message().find("ranks 0 and 2"),
            std::string_view::npos)
      << three_on_two.status();
  auto allowed = AssignGpus(4, 2, true);
  ASSERT_TRUE(allowed.ok());
  EXPECT_EQ(*allowed, (std::vector<int>{0, 1, 0, 1}));
  EXPECT_EQ(AssignGpus(0, 1, true).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace shardlm
