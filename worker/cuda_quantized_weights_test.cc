// --cuda-weights quantized end to end (issue #43 part 4): a synthetic
// two-layer Llama whose matrices are Q8_0 or Q4_0 blocks
// (model/in_memory_weights.h), loaded as a shard loads it (the blocks kept),
// uploaded packed (UploadLlamaWeights), against the CPU ModelRunner on the
// same host weights (its quantized Linear reads the same blocks),
// teacher-forced on the CPU's greedy tokens: a 40-token prefill (the
// dequantize + cuBLAS path) then decode steps of one row (the quantized
// GEMV). Also: what was packed, and that the rank's dequantization scratch
// is the bytes worker/activation_memory.h counts.
//
// Part of the cuda_model_runner_test binary (its session step runs it):
// skips, saying why, without a GPU. Not run on a GPU yet.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <vector>

#include "absl/types/span.h"
#include "backend/cuda_backend.h"
#include "core/max_abs_diff.h"
#include "gtest/gtest.h"
#include "model/in_memory_weights.h"
#include "worker/activation_memory.h"
#include "worker/cuda_model_runner.h"
#include "worker/cuda_weights.h"
#include "worker/kv_pool.h"
#include "worker/model_runner.h"
#include "worker/seq_step_testing.h"

namespace shardlm {
namespace {

// The index of the largest logit.
int32_t Argmax(absl::Span<const float> logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) -
                              logits.begin());
}

double MaxAbs(absl::Span<const float> v) {
  double m = 0;
  for (float x : v) m = std::max(m, std::abs(double{x}));
  return m;
}

class CudaQuantizedWeightsTest : public ::testing::TestWithParam<DType> {};

TEST_P(CudaQuantizedWeightsTest, RunnerMatchesTheCpuOnTheSameBlocks) {
  if (auto n = CudaDeviceCount(); !n.ok()) {
    GTEST_SKIP() << n.status().message();
  }
  const DType t = GetParam();
  ModelConfig c;
  c.name = "synthetic-quantized";
  c.n_layers = 2;
  c.hidden = 256;
  c.ffn_hidden = 544;  // 17 blocks of 32.
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 64;
  c.vocab_size = 515;
  c.context_length = 256;
  ASSERT_TRUE(c.Validate().ok()) << c.Validate();
  const KvPoolConfig kv{.n_layers = c.n_layers,
                        .kv_heads = c.n_kv_heads,
                        .head_dim = c.head_dim,
                        .block_size = 16,
                        .num_blocks = 8,
                        .dtype = DType::kF32};  // The CPU keeps f32 KV.
  const std::unique_ptr<InMemoryWeights> source = RandomLlamaWeights(c, 5, t);
  absl::StatusOr<LlamaWeights> host = LoadLlamaWeights(*source);
  ASSERT_TRUE(host.ok()) << host.status();
  ASSERT_EQ(host->layers[0].wq.dtype(), t);

  KvPoolConfig gpu_kv = kv;
  gpu_kv.dtype = DType::kBF16;
  auto gpu = CudaModelRunner::Create(0, c, gpu_kv);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  absl::StatusOr<LlamaWeights> packed =
      UploadLlamaWeights(*host, (*gpu)->backend(), (*gpu)->exec(),
                         {.weights = CudaWeights::kQuantized});
  ASSERT_TRUE(packed.ok()) << packed.status();
  // Every projection and the LM head packed; the embedding bf16.
  for (const Tensor* m : {&packed->layers[0].wqkv, &packed->layers[0].wo,
                          &packed->layers[1].w_gate_up,
                          &packed->layers[1].w_down, &packed->lm_head}) {
    EXPECT_EQ(m->dtype(), t) << m->DebugString();
    EXPECT_EQ(m->memory(), MemoryType::kDevice);
  }
  EXPECT_EQ(packed->token_embd.dtype(), DType::kBF16);
  // The scratch held is what the accounting counts: the largest matrix's
  // values in bf16 (the fused gate/up, 1088 x 256, here).
  EXPECT_EQ(DequantScratchBytesCuda((*gpu)->exec()),
            GpuDequantScratchBytes(*packed));
  EXPECT_EQ(GpuDequantScratchBytes(*packed), 2 * 2 * c.ffn_hidden * c.hidden);
  ASSERT_TRUE((*gpu)->SetWeights(*std::move(packed)).ok());
  ModelRunner cpu(*std::move(host), *KvPool::Create(kv));

  // Bound as cuda_model_runner_test's synthetic model: the GPU rounds GEMM
  // inputs and the KV cache to bf16 (and the prefill's weights, as the bf16
  // upload does); 3% of the largest logit.
  std::vector<int32_t> prompt(40);
  std::mt19937 rng(9);
  for (auto& tok : prompt) tok = static_cast<int32_t>(rng() % c.vocab_size);
  const StepInput first = SeqStep(prompt, 0, kv.block_size, kv.num_blocks);
  auto a = cpu.Forward(first);
  auto b = (*gpu)->Forward(first);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  int32_t pos = static_cast<int32_t>(prompt.size());
  for (int step = 0; step < 16; ++step) {
    const auto logits = a->f32();
    const double max_ref = MaxAbs(logits);
    // core/max_abs_diff.h: +inf on a NaN or a size mismatch.
    const double d = MaxAbsDiff(b->f32(), logits);
    EXPECT_LE(d, 0.03 * max_ref) << DTypeName(t) << " step " << step;
    std::printf("%s step %2d: max |gpu - cpu| %.4g of %.4g\n", DTypeName(t),
                step, d, max_ref);
    // The greedy token agrees, but for a near tie: the GPU's pick may
    // differ only where the CPU puts both within twice the logit error.
    const int32_t want = Argmax(logits);
    const int32_t got = Argmax(b->f32());
    if (got != want) {
      EXPECT_LE(logits[want] - logits[got], 2 * d)
          << DTypeName(t) << " step " << step << ": the GPU picks " << got
          << ", the CPU " << want;
    }
    const StepInput s = SeqStep({want}, pos++, kv.block_size, kv.num_blocks);
    a = cpu.Forward(s);
    b = (*gpu)->Forward(s);
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_TRUE(b.ok()) << b.status();
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, CudaQuantizedWeightsTest,
                         ::testing::Values(DType::kQ8_0, DType::kQ4_0),
                         [](const auto& info) {
                           return std::string(DTypeName(info.param));
                         });

}  // namespace
}  // namespace shardlm
