#include "worker/activation_memory.h"

#include <vector>

#include "gtest/gtest.h"
#include "model/model_config.h"
#include "model/shard_plan.h"

namespace shardlm {
namespace {

// A toy rank, every buffer counted by hand: hidden 8, 2 query heads and 1
// KV head of 4 dims (q_dim 8, kv_dim 4), 16 FFN columns, 10 vocabulary rows.
constexpr RankActivationDims kToy{.hidden = 8,
                                  .heads = 2,
                                  .kv_heads = 1,
                                  .head_dim = 4,
                                  .ffn = 16,
                                  .vocab_padded = 10};

TEST(GpuActivationBytesTest, CountsEveryBufferByHand) {
  // Per token: ids 4, x 8*4 = 32, q k v (8+4+4)*4 = 64, fused qkv 64,
  // fused gate/up 32*4 = 128, bf16 GEMM inputs (8+8+16)*2 = 64: 356.
  // Per row: row index and sampled id 8, last hidden f32 32 and bf16 16,
  // logits 10*4 = 40: 96.
  // Decode workspace: 2 rows * 2 heads * 64 splits * (4+2) floats * 4 = 6144.
  EXPECT_EQ(GpuActivationBytes(kToy, /*tokens=*/3, /*rows=*/2),
            3 * 356 + 2 * 96 + 6144);
}

// Decode steps run padded to their CUDA graph's batch size (5 sequences
// at 8), so 5 rows are counted as 8, and as 8 tokens when fewer are asked.
TEST(GpuActivationBytesTest, RowsCountAtTheirGraphBatchSize) {
  const int64_t workspace = 8 * 2 * 64 * 6 * 4;
  EXPECT_EQ(GpuActivationBytes(kToy, /*tokens=*/3, /*rows=*/5),
            8 * 356 + 8 * 96 + workspace);
  EXPECT_EQ(GpuActivationBytes(kToy, /*tokens=*/100, /*rows=*/5),
            100 * 356 + 8 * 96 + workspace);
  // Past the graphs' range rows count as they are.
  EXPECT_EQ(GpuActivationBytes(kToy, 1000, 300),
            1000 * 356 + 300 * 96 + 300 * 2 * 64 * 6 * 4);
}

TEST(GpuActivationBytesTest, TensorParallelAddsPartialSumsAndTheGather) {
  RankActivationDims tp = kToy;
  tp.tp = 2;
  // A middle stage: partial sums 8*4 = 32 more per token; rows keep only
  // their indices (8) without the LM head.
  tp.last_stage = false;
  EXPECT_EQ(GpuActivationBytes(tp, 3, 2), 3 * (356 + 32) + 2 * 8 + 6144);
  // The last stage gathers [tp, rows, vocab_padded]: 2*10*4 = 80 per row.
  tp.last_stage = true;
  EXPECT_EQ(GpuActivationBytes(tp, 3, 2),
            3 * (356 + 32) + 2 * (96 + 80) + 6144);
}

TEST(GpuActivationBytesTest, MixturesHoldOneExpertsRowsAndPartialSums) {
  RankActivationDims moe = kToy;
  moe.experts = 4;
  // Per token, in place of fused gate/up (128) and SwiGLU (32): router
  // logits 4*4 = 16, expert input bf16 8*2 = 16, gate and up 2*16*4 = 128,
  // SwiGLU bf16 16*2 = 32, output 8*4 = 32; and partial sums 32 even at
  // tp = 1 (the experts scatter into them): 356 - 160 + 256 = 452.
  EXPECT_EQ(GpuActivationBytes(moe, 3, 2), 3 * 452 + 2 * 96 + 6144);
}

TEST(GpuActivationBytesTest, DimsComeFromTheShard) {
  ModelConfig c;
  c.hidden = 576;
  c.head_dim = 64;
  ShardSpec spec{.tp_rank = 1,
                 .tp_size = 3,
                 .pp_rank = 0,
                 .pp_size = 2,
                 .kv_head_begin = 1,
                 .kv_head_end = 2,
                 .head_begin = 3,
                 .head_end = 6,
                 .ffn_begin = 512,
                 .ffn_end = 1024,
                 .vocab_padded = 16384};
  const RankActivationDims d = ActivationDimsOf(c, spec);
  EXPECT_EQ(d.hidden, 576);
  EXPECT_EQ(d.heads, 3);
  EXPECT_EQ(d.kv_heads, 1);
  EXPECT_EQ(d.head_dim, 64);
  EXPECT_EQ(d.ffn, 512);
  EXPECT_EQ(d.vocab_padded, 16384);
  EXPECT_EQ(d.tp, 3);
  EXPECT_FALSE(d.last_stage);
  EXPECT_EQ(d.experts, 0);
  c.n_experts = 8;
  EXPECT_EQ(ActivationDimsOf(c, spec).experts, 8);
}

// Quantized weights on a GPU: packed matrices count their packed (GGUF)
// bytes, by hand; the scratch is bf16 for the largest device Q8_0 / Q4_0
// matrix. Device tensors are views of host memory marked kDevice (only
// their sizes are read).
TEST(QuantizedWeightMemoryTest, PackedBytesAndTheScratchByHand) {
  std::vector<uint8_t> mem(1 << 20);
  const auto dev = [&](DType t, Shape shape) {
    return *Tensor::View(t, std::move(shape), mem.data(), MemoryType::kDevice);
  };
  LlamaWeights w;
  std::vector<uint8_t> embd(200 * 64 * 2);
  w.token_embd =
      *Tensor::View(DType::kBF16, {200, 64}, embd.data(), MemoryType::kDevice);
  w.output_norm = dev(DType::kF32, {64});
  w.lm_head = dev(DType::kQ8_0, {200, 64});
  LlamaLayerWeights l;
  l.attn_norm = dev(DType::kF32, {64});
  l.ffn_norm = dev(DType::kF32, {64});
  l.wqkv = dev(DType::kQ8_0, {96, 64});
  l.wo = dev(DType::kBF16, {64, 32});  // Not packed (another format).
  l.w_gate_up = dev(DType::kQ4_0, {128, 64});
  l.w_down = dev(DType::kQ4_0, {64, 64});
  w.layers.push_back(l);
  // Q8_0: 34 bytes a block of 32, Q4_0: 18.
  const int64_t layer =
      2 * 64 * 4 + 96 * 2 * 34 + 64 * 32 * 2 + 128 * 2 * 18 + 64 * 2 * 18;
  const int64_t head = 200 * 2 * 34;
  EXPECT_EQ(w.bytes(), 64 * 4 + head + 200 * 64 * 2 + layer);
  EXPECT_EQ(w.bytes_per_step(), 64 * 4 + head + layer);
  EXPECT_EQ(LargestPackedMatrix(w), 200 * 64);
  EXPECT_EQ(GpuDequantScratchBytes(w), 200 * 64 * 2);

  // Without the LM head the largest is the fused gate/up.
  w.lm_head = Tensor();
  EXPECT_EQ(GpuDequantScratchBytes(w), 128 * 64 * 2);
  // A host Q4_0 tensor is not a packed device matrix.
  w.layers[0].w_gate_up =
      *Tensor::View(DType::kQ4_0, {128, 64}, mem.data(), MemoryType::kHost);
  EXPECT_EQ(LargestPackedMatrix(w), 96 * 64);
  // bf16 weights only: no scratch.
  w.layers[0].wqkv = dev(DType::kBF16, {96, 64});
  w.layers[0].w_down = dev(DType::kBF16, {64, 64});
  w.layers[0].w_gate_up = Tensor();
  EXPECT_EQ(GpuDequantScratchBytes(w), 0);
}

}  // namespace
}  // namespace shardlm
