// The engine on one GPU against the engine on the CPU, on real weights
// ($SHARDLM_MODEL): the same requests batched together (chunked prefill,
// prefix-cache hits, recompute preemption under a small KV pool, swaps to
// the host tier and a prompt longer than the device pool, greedy and
// seeded sampling, log-probabilities) give the same tokens. Skips
// without a GPU or the model.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "backend/device.h"
#include "core/max_abs_diff.h"
#include "engine/engine.h"
#include "engine/engine_leak_check.h"
#include "executor/cuda_executor.h"
#include "executor/local_engine.h"
#include "model/tokenizer.h"
#include "model/weight_source.h"
#include "testing/gpu_parity_prompts.h"

namespace shardlm {
namespace {

std::string ModelPath() {
  const char* env = std::getenv("SHARDLM_MODEL");
  return env != nullptr ? env : "models/SmolLM2-135M-Instruct.Q4_1.gguf";
}

class CudaEngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (QueryCuda().devices == 0) {
      GTEST_SKIP() << "no CUDA device: " << QueryCuda().why_none;
    }
    if (!std::filesystem::exists(ModelPath())) {
      // Always provided by the build and the GPU kit: missing is a failure.
      FAIL() << "no model at " << ModelPath() << " (set SHARDLM_MODEL)";
    }
    auto source = OpenWeights(ModelPath());
    ASSERT_TRUE(source.ok()) << source.status();
    source_ = std::move(*source);
    auto tokenizer = LoadTokenizer(ModelPath());
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    for (const char* p : kGpuParityPrompts)
      prompts_.push_back((*tokenizer)->Encode(p));
  }

  std::vector<GenerateRequest> Requests() const {
    std::vector<GenerateRequest> r;
    for (const auto& p : prompts_) {
      r.push_back({.prompt = p, .max_tokens = 24});
    }
    // Seeded sampling draws the same numbers on both (SampleUniform); a
    // low temperature keeps bf16 differences from moving a draw across a
    // token boundary.
    r.push_back({.prompt = prompts_[1],
                 .max_tokens = 16,
                 .sampling = {.temperature = 0.3f, .top_k = 20, .seed = 7}});
    r.push_back({.prompt = prompts_[2],
                 .max_tokens = 8,
                 .return_prompt_logits = true,
                 .logprobs = 3});
    // Shares prompt 0's blocks through the prefix cache.
    r.push_back({.prompt = prompts_[0], .max_tokens = 24});
    return r;
  }

  std::vector<GenerateResult> Run(const EngineOptions& options) {
    return Run(options, Requests());
  }
  std::vector<GenerateResult> Run(const EngineOptions& options,
                                  const std::vector<GenerateRequest>& reqs) {
    EngineLeakCheck engines;  // Checked (and freed) on return.
    Engine* engine = engines.Keep(CreateLocalEngine(*source_, options));
    if (engine == nullptr) return {};
    auto results = engine->GenerateBatch(reqs);
    EXPECT_TRUE(results.ok()) << results.status();
    stats_ = engine->stats();
    return results.ok() ? *results : std::vector<GenerateResult>{};
  }

  static void ExpectSame(const std::vector<GenerateResult>& gpu,
                         const std::vector<GenerateResult>& cpu) {
    ASSERT_EQ(gpu.size(), cpu.size());
    for (size_t i = 0; i < gpu.size(); ++i) {
      SCOPED_TRACE("request " + std::to_string(i));
      EXPECT_EQ(gpu[i].tokens, cpu[i].tokens);
      ASSERT_EQ(gpu[i].prompt_logits.size(), cpu[i].prompt_logits.size());
      if (!cpu[i].prompt_logits.empty()) {
        // NaN-proof: a NaN logit makes it +inf.
        const double max_diff =
            MaxAbsDiff(gpu[i].prompt_logits, cpu[i].prompt_logits);
        // CudaModelRunnerTest's bound: bf16 weights and GEMM inputs move
        // these logits by ~0.2; a wrong shard layout by far more.
        std::printf("prompt logits max |gpu - cpu| %.4f\n", max_diff);
        EXPECT_LE(max_diff, 1.0);
      }
      ASSERT_EQ(gpu[i].logprobs.size(), cpu[i].logprobs.size());
      for (size_t t = 0; t < gpu[i].logprobs.size(); ++t) {
        const TokenLogprobs& g = gpu[i].logprobs[t];
        const TokenLogprobs& c = cpu[i].logprobs[t];
        // Logits differ by at most ~0.2 (bf16 weights and activations).
        EXPECT_NEAR(g.sampled, c.sampled, 0.3) << "token " << t;
        ASSERT_EQ(g.top.size(), c.top.size());
        EXPECT_EQ(g.top[0].token, c.top[0].token) << "token " << t;
      }
    }
  }

  std::unique_ptr<WeightSource> source_;
  std::vector<std::vector<int32_t>> prompts_;
  SchedulerStats stats_;
};

TEST_F(CudaEngineTest, BatchedRequestsMatchTheCpuEngine) {
  // Chunked prefill: prompts of 7-31 tokens in steps of at most 16. The
  // CPU reference keeps an f32 KV cache; the GPU's is bf16.
  const EngineOptions cpu{.kv = {.dtype = DType::kF32},
                          .limits = {.max_batched_tokens = 16}};
  EngineOptions gpu = cpu;
  gpu.device = DeviceKind::kCuda;
  gpu.kv.dtype.reset();  // bf16, the only KV type on GPUs.
  const auto want = Run(cpu);
  const auto got = Run(gpu);
  ExpectSame(got, want);
}

TEST_F(CudaEngineTest, RecomputePreemptionOnASmallGpuPoolMatchesTheCpu) {
  const ModelConfig& c = source_->config();
  // bf16 K and V of every layer: 6 blocks hold two of the 7 requests (up
  // to 4 blocks each) at once, so sequences are preempted and recomputed.
  const int64_t block_bytes =
      2 * c.n_layers * 16 * c.n_kv_heads * c.head_dim * 2;
  const EngineOptions cpu{.kv = {.dtype = DType::kF32},
                          .limits = {.max_batched_tokens = 64}};
  EngineOptions gpu = cpu;
  gpu.device = DeviceKind::kCuda;
  gpu.kv.dtype.reset();  // bf16, the only KV type on GPUs.
  gpu.kv.kv_cache_bytes = 6 * block_bytes;
  const auto want = Run(cpu);
  const auto got = Run(gpu);
  std::printf("gpu preemptions (recompute): %lld\n",
              static_cast<long long>(stats_.preempted_recompute));
  EXPECT_GT(stats_.preempted_recompute, 0);
  ExpectSame(got, want);
}

// The host KV tier in pinned memory: with 6 device blocks and room for
// 40 on the host, running requests are swapped out and back in (copies
// on the copy stream), and a prompt longer than the whole device pool
// runs alone with its oldest blocks on the host, read there in place.
TEST_F(CudaEngineTest, HostTierSwapsAndAnOverlongPromptMatchTheCpu) {
  const ModelConfig& c = source_->config();
  const int64_t block_bytes =
      2 * c.n_layers * 16 * c.n_kv_heads * c.head_dim * 2;
  const EngineOptions cpu{.kv = {.dtype = DType::kF32},
                          .limits = {.max_batched_tokens = 64}};
  EngineOptions gpu = cpu;
  gpu.device = DeviceKind::kCuda;
  gpu.kv.dtype.reset();  // bf16, the only KV type on GPUs.
  gpu.kv.kv_cache_bytes = 6 * block_bytes;
  gpu.kv.cpu_offload_bytes = 40 * block_bytes;
  {
    const auto want = Run(cpu);
    const auto got = Run(gpu);
    std::printf("gpu preemptions: %lld swapped, %lld recomputed\n",
                static_cast<long long>(stats_.preempted_swap),
                static_cast<long long>(stats_.preempted_recompute));
    EXPECT_GT(stats_.preempted_swap, 0);
    ExpectSame(got, want);
  }
  // 6 device blocks hold 96 tokens; this prompt has more.
  std::vector<int32_t> overlong;
  while (overlong.size() < 130) {
    for (const auto& p : prompts_)
      overlong.insert(overlong.end(), p.begin(), p.end());
  }
  const std::vector<GenerateRequest> one = {
      {.prompt = overlong, .max_tokens = 16}};
  const auto want = Run(cpu, one);
  const auto got = Run(gpu, one);
  std::printf("overlong prompt of %zu tokens: %lld blocks offloaded\n",
              overlong.size(), static_cast<long long>(stats_.offloaded));
  EXPECT_GT(stats_.offloaded, 0);
  ExpectSame(got, want);
}

// TP x PP shards on threads sharing this GPU (their communicators stage
// through the host), against the CPU at TP = PP = 1.
TEST_F(CudaEngineTest, ShardsOnOneGpuMatchTheCpu) {
  const EngineOptions cpu{.kv = {.dtype = DType::kF32},
                          .limits = {.max_batched_tokens = 16}};
  const auto want = Run(cpu);
  for (const auto& [tp, pp] : {std::pair{2, 1}, {1, 2}, {2, 2}}) {
    SCOPED_TRACE("tp " + std::to_string(tp) + " pp " + std::to_string(pp));
    EngineOptions gpu = cpu;
    gpu.device = DeviceKind::kCuda;
    gpu.kv.dtype.reset();  // bf16, the only KV type on GPUs.
    gpu.tp = tp;
    gpu.pp = pp;
    gpu.allow_shared_gpu = true;
    gpu.kv.kv_cache_bytes = int64_t{64} << 20;  // Per rank.
    ExpectSame(Run(gpu), want);
  }
}

TEST_F(CudaEngineTest, RanksSharingAGpuNeedTheFlag) {
  // One rank more than there are GPUs.
  auto engine = CreateLocalEngine(
      *source_, {.pp = QueryCuda().devices + 1, .device = DeviceKind::kCuda});
  EXPECT_EQ(engine.status().code(), absl::StatusCode::kFailedPrecondition)
      << engine.status();
}

TEST_F(CudaEngineTest, DefaultKvSizingTakesTheRestOfTheGpu) {
  auto executor = CreateCudaExecutor(*source_, {.device = 0});
  ASSERT_TRUE(executor.ok()) << executor.status();
  const ModelConfig& c = source_->config();
  const int64_t block_bytes =
      2 * c.n_layers * 16 * c.n_kv_heads * c.head_dim * 2;
  // At least a full context fits on any GPU this model is tested on.
  EXPECT_GE((*executor)->num_kv_blocks() * 16, c.context_length);
  std::printf("default KV pool: %lld blocks (%.2f GiB)\n",
              static_cast<long long>((*executor)->num_kv_blocks()),
              (*executor)->num_kv_blocks() * block_bytes / 1073741824.0);
}

}  // namespace
}  // namespace shardlm
