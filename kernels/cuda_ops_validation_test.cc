// The CUDA launchers check their arguments before any CUDA call, so these
// run on every machine that builds CUDA, GPU or not (a unit binary: it
// never skips).
#include <cstdint>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/attention/paged_attention.h"
#include "kernels/cuda_ops.h"

namespace shardlm {
namespace {

TEST(CudaOpsValidationTest, HostMemoryAndBadShapesAreInvalidArgument) {
  Tensor x = *Tensor::Host(DType::kF32, {2, 8});
  Tensor w = *Tensor::Host(DType::kF32, {8});
  absl::Status s = RmsNormCuda(x, w, 1e-5f, x, {});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(std::string(s.message()).find("host memory"), std::string::npos)
      << s;
  // Device-typed views (never dereferenced: validation fails first).
  static float fake[64];
  Tensor dx = *Tensor::View(DType::kF32, {2, 8}, fake, MemoryType::kDevice);
  Tensor dw = *Tensor::View(DType::kF32, {7}, fake, MemoryType::kDevice);
  s = RmsNormCuda(dx, dw, 1e-5f, dx, {});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(std::string(s.message()).find("weight"), std::string::npos) << s;
  Tensor dq = *Tensor::View(DType::kF32, {1, 3, 48}, fake, MemoryType::kDevice);
  CudaAttentionBatch empty;
  s = PagedAttentionCuda(dq, dq, dq, empty, 1.0f, dq, {});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  Tensor xi = *Tensor::View(DType::kF32, {2, 8}, fake, MemoryType::kDevice);
  s = LinearCuda(xi, xi, xi, false, {});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(std::string(s.message()).find("BF16"), std::string::npos) << s;
}

// The quantized-weight entry points refuse before any CUDA call: nine rows
// for the GEMV, a format without a device layout, a step of nine rows
// without a scratch (FailedPrecondition naming it), no cuBLAS handle for
// the scratch.
TEST(CudaOpsValidationTest, QuantizedWeightsRefuseBadArguments) {
  alignas(16) static uint8_t fake[4096];
  const Tensor w =
      *Tensor::View(DType::kQ8_0, {3, 64}, fake, MemoryType::kDevice);
  const Tensor x9 =
      *Tensor::View(DType::kBF16, {9, 64}, fake, MemoryType::kDevice);
  Tensor y9 = *Tensor::View(DType::kF32, {9, 3}, fake, MemoryType::kDevice);
  absl::Status s = LinearQuantizedCuda(x9, w, y9, false, {});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(std::string(s.message()).find("9 rows"), std::string::npos) << s;
  s = LinearPackedCuda(x9, w, y9, false, Tensor(), {});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(std::string(s.message()).find("scratch"), std::string::npos) << s;
  const Tensor q41 =
      *Tensor::View(DType::kQ4_1, {3, 64}, fake, MemoryType::kDevice);
  const Tensor x1 =
      *Tensor::View(DType::kBF16, {1, 64}, fake, MemoryType::kDevice);
  Tensor y1 = *Tensor::View(DType::kF32, {1, 3}, fake, MemoryType::kDevice);
  s = LinearQuantizedCuda(x1, q41, y1, false, {});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  Tensor dst = *Tensor::View(DType::kBF16, {2, 64}, fake, MemoryType::kDevice);
  s = DequantizePackedCuda(w, 2, 4, dst, {});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  s = ReserveDequantScratchCuda({}, 1024);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_TRUE(ReserveDequantScratchCuda({}, 0).ok());  // Nothing to hold.
  EXPECT_TRUE(DequantScratchCuda({}).empty());
}

// The fused QKV kernel checks shapes, the batch and the RoPE table before
// any CUDA call.
TEST(CudaOpsValidationTest, QkvRopeWriteKvRefusesBadArguments) {
  static float fake[4096];
  const auto device = [](Shape shape, DType t = DType::kF32) {
    return *Tensor::View(t, std::move(shape), fake, MemoryType::kDevice);
  };
  // 2 tokens, 4 heads over 2 KV heads of 8: qkv [2, (4 + 4) * 8].
  Tensor q = device({2, 4, 8});
  Tensor cache = device({4, 16, 2, 8}, DType::kBF16);
  CudaAttentionBatch none;  // Holds no tokens.
  CudaRopeTable rope;       // Empty.
  const auto expect = [](const absl::Status& s, const std::string& phrase) {
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(std::string(s.message()).find(phrase), std::string::npos) << s;
  };
  expect(QkvRopeWriteKvCuda(device({2, 60}), none, rope, q, cache, cache, {}),
         "QkvRopeWriteKvCuda: qkv");
  expect(QkvRopeWriteKvCuda(device({2, 64}), none, rope, q, cache, cache, {}),
         "2 tokens, batch of 0");
  Tensor flat_q = device({2, 32});
  expect(
      QkvRopeWriteKvCuda(device({2, 64}), none, rope, flat_q, cache, cache, {}),
      "q must be [n, heads, d]");
  Tensor host_q = *Tensor::Host(DType::kF32, {2, 4, 8});
  expect(
      QkvRopeWriteKvCuda(device({2, 64}), none, rope, host_q, cache, cache, {}),
      "host memory");
}

// Rows with logit processors are sampled on the host (SampleStep); the
// device sampler refuses them rather than ignore their penalties.
TEST(CudaOpsValidationTest, SampleCudaRefusesRowsWithLogitProcessors) {
  static float fake[64];
  static int32_t ids[2];
  Tensor logits =
      *Tensor::View(DType::kF32, {2, 32}, fake, MemoryType::kDevice);
  Tensor out = *Tensor::View(DType::kI32, {2}, ids, MemoryType::kDevice);
  const std::vector<uint64_t> steps = {0, 0};
  for (const SamplingParams& p :
       {SamplingParams{.frequency_penalty = 0.5f},
        SamplingParams{.repetition_penalty = 1.2f},
        SamplingParams{.logit_bias = {{.token = 3, .bias = -100}}}}) {
    const std::vector<SamplingParams> params = {SamplingParams{}, p};
    const absl::Status s = SampleCuda(logits, params, steps, out, {});
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(std::string(s.message()).find("applied on the host"),
              std::string::npos)
        << s;
  }
}

// CudaAttentionBatch checks the batch against the pool before it
// allocates or copies anything.
TEST(CudaOpsValidationTest, AttentionBatchIsCheckedBeforeUpload) {
  const std::vector<int32_t> pos = {0, 20}, seq = {0, 0};
  const std::vector<int32_t> table = {1, 2}, bad_table = {1, 9};
  CudaAttentionBatch b;
  AttentionBatch ok{.positions = pos, .token_seq = seq};
  ok.block_tables = {table};
  // Block 9 outside a pool of 4.
  AttentionBatch bad_block = ok;
  bad_block.block_tables = {bad_table};
  absl::Status s = b.Upload(bad_block, 16, 4, 0, {});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(std::string(s.message()).find("physical block 9"),
            std::string::npos)
      << s;
  // Position 40 needs a third block.
  const std::vector<int32_t> far = {0, 40};
  AttentionBatch short_table = ok;
  short_table.positions = far;
  s = b.Upload(short_table, 16, 4, 0, {});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  // A token of a sequence that has no table.
  const std::vector<int32_t> seq1 = {0, 1};
  AttentionBatch no_seq = ok;
  no_seq.token_seq = seq1;
  s = b.Upload(no_seq, 16, 4, 0, {});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(b.tokens(), 0);  // Nothing was taken over.
}

// Gated DeltaNet's runs must cover the step in order, each through its own
// slot of those held, and the shapes must be ones the kernels build.
TEST(CudaOpsValidationTest, GatedDeltaNetRefusesBadRunsAndShapes) {
  static float fake[1 << 16];
  const auto dev = [](const Shape& shape) {
    return *Tensor::View(DType::kF32, shape, fake, MemoryType::kDevice);
  };
  const GatedDeltaNetShape sh{
      .k_heads = 1, .v_heads = 2, .k_dim = 8, .v_dim = 8};
  const int64_t n = 4, ch = 2 * 8 + 2 * 8;
  const Tensor qk = dev({n, 16}), v = dev({n, 16}), z = dev({n, 16});
  const Tensor bi = dev({n, 2}), ai = dev({n, 2}), cw = dev({ch, 4});
  const Tensor dt = dev({2}), a = dev({2}), norm = dev({8});
  Tensor cs = dev({3, 3, ch}), rs = dev({3, 2, 8, 8});
  Tensor co = dev({n, ch}), o = dev({n, 16}), out = dev({n, 16});
  const auto call = [&](std::vector<CudaDeltaRun> runs,
                        const GatedDeltaNetShape& shape, const Tensor& w) {
    return GatedDeltaNetCuda(qk, v, z, bi, ai, w, dt, a, norm, 1e-6f, shape,
                             runs, cs, rs, co, o, out, {});
  };
  const auto refused = [](const absl::Status& s, const std::string& what) {
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(std::string(s.message()).find(what), std::string::npos) << s;
  };
  refused(call({{0, 2, 0, true}, {3, 4, 1, false}}, sh, cw), "does not follow");
  refused(call({{0, 2, 0, true}}, sh, cw), "cover 2 of the step's 4");
  refused(call({{0, 2, 1, true}, {2, 4, 1, false}}, sh, cw), "two runs");
  refused(call({{0, 4, 3, true}}, sh, cw), "outside the 3 held");
  refused(call({{0, 4, 0, true}}, sh, dev({ch, 9})), "9 convolution taps");
  GatedDeltaNetShape wide = sh;
  wide.k_dim = 512;
  refused(call({{0, 4, 0, true}}, wide, cw), "above 256");
  GatedDeltaNetShape share = sh;
  share.v_head_begin = 1;
  share.v_heads_total = 2;
  refused(call({{0, 4, 0, true}}, share, cw), "value heads [1, 3) of 2");
  Tensor host = *Tensor::Host(DType::kF32, {n, 16});
  const absl::Status s = SigmoidGateCuda(host, host, {});
  refused(s, "host memory");
  Tensor x = dev({n, 16});
  refused(SigmoidGateCuda(x, dev({n, 2}), {}), "gate");
}

}  // namespace
}  // namespace shardlm
