#include "worker/gpt_oss_experts.h"

#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "model/dequantize.h"
#include "model/in_memory_weights.h"
#include "model/model_config.h"

namespace shardlm {
namespace {

constexpr int64_t kExperts = 2, kF = 32, kHidden = 64;

// transformers' FP4_VALUES (integrations/mxfp4.py).
constexpr float kFp4[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,
                            4.0f,  6.0f,  -0.0f, -0.5f, -1.0f, -1.5f,
                            -2.0f, -3.0f, -4.0f, -6.0f};

// gpt-oss's MXFP4 tensors of random bytes, and each value as transformers'
// convert_moe_packed_tensors decodes it.
struct Mxfp4 {
  std::vector<uint8_t> blocks, scales;
  int64_t rows, cols;
  float Value(int64_t e, int64_t r, int64_t c) const {
    const int64_t row = e * rows + r, g = cols / 32;
    const uint8_t byte = blocks[(row * g + c / 32) * 16 + (c % 32) / 2];
    const int nibble = c % 2 == 0 ? byte & 0xf : byte >> 4;
    return std::ldexp(kFp4[nibble], scales[row * g + c / 32] - 127);
  }
};

Mxfp4 RandomMxfp4(std::mt19937& rng, int64_t rows, int64_t cols) {
  Mxfp4 m{.rows = rows, .cols = cols};
  m.blocks.resize(kExperts * rows * cols / 2);
  m.scales.resize(kExperts * rows * cols / 32);
  for (uint8_t& b : m.blocks) b = rng() & 0xff;
  for (uint8_t& s : m.scales) s = 117 + rng() % 20;  // 2^-10 .. 2^9
  return m;
}

TEST(GptOssExpertsTest, Mxfp4BlocksRepackToTheSameValues) {
  std::mt19937 rng(57);
  const Mxfp4 gate_up = RandomMxfp4(rng, 2 * kF, kHidden);
  const Mxfp4 down = RandomMxfp4(rng, kHidden, kF);
  InMemoryWeights w(SmallTestConfig());
  w.AddRaw("blk.3.ffn_gate_up_exps.blocks", DType::kI8,
           {kExperts, 2 * kF, kHidden / 32, 16}, gate_up.blocks);
  w.AddRaw("blk.3.ffn_gate_up_exps.scales", DType::kI8,
           {kExperts, 2 * kF, kHidden / 32}, gate_up.scales);
  w.AddRaw("blk.3.ffn_down_exps.blocks", DType::kI8,
           {kExperts, kHidden, kF / 32, 16}, down.blocks);
  w.AddRaw("blk.3.ffn_down_exps.scales", DType::kI8,
           {kExperts, kHidden, kF / 32}, down.scales);
  ASSERT_TRUE(HasGptOssExperts(w, 3));
  EXPECT_FALSE(HasGptOssExperts(w, 2));
  ASSERT_TRUE(CheckGptOssExperts(w, 3, kExperts, kF, kHidden).ok());
  for (int64_t e = 0; e < kExperts; ++e) {
    for (const char* kind : {"ffn_gate", "ffn_up", "ffn_down"}) {
      absl::StatusOr<Tensor> t =
          ReadGptOssExpert(w, 3, kind, e, kExperts, kF, kHidden);
      ASSERT_TRUE(t.ok()) << t.status();
      ASSERT_EQ(t->dtype(), DType::kMXFP4);
      const bool is_down = std::string_view(kind) == "ffn_down";
      const int64_t rows = is_down ? kHidden : kF;
      const int64_t cols = is_down ? kF : kHidden;
      const TensorInfo info{.name = kind,
                            .dtype = DType::kMXFP4,
                            .shape = {rows, cols},
                            .bytes = static_cast<uint64_t>(t->bytes())};
      absl::StatusOr<Tensor> f32 = DequantizeSlice(
          info,
          absl::MakeConstSpan(static_cast<const uint8_t*>(t->raw()),
                              t->bytes()),
          0, rows, 0, cols);
      ASSERT_TRUE(f32.ok()) << f32.status();
      const int up = std::string_view(kind) == "ffn_up";
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < cols; ++c) {
          const float want =
              is_down ? down.Value(e, r, c) : gate_up.Value(e, 2 * r + up, c);
          ASSERT_EQ(f32->f32()[r * cols + c], want)
              << kind << " expert " << e << " [" << r << ", " << c << "]";
        }
      }
    }
  }
}

TEST(GptOssExpertsTest, DequantizedFormIsTransposedAndDeinterleaved) {
  std::mt19937 rng(58);
  std::normal_distribution<float> normal;
  std::vector<float> gate_up(kExperts * kHidden * 2 * kF);
  std::vector<float> down(kExperts * kF * kHidden);
  for (float& x : gate_up) x = normal(rng);
  for (float& x : down) x = normal(rng);
  InMemoryWeights w(SmallTestConfig());
  w.AddF32("blk.0.ffn_gate_up_exps.weight_t", {kExperts, kHidden, 2 * kF},
           gate_up);
  w.AddF32("blk.0.ffn_down_exps.weight_t", {kExperts, kF, kHidden}, down);
  ASSERT_TRUE(HasGptOssExperts(w, 0));
  ASSERT_TRUE(CheckGptOssExperts(w, 0, kExperts, kF, kHidden).ok());
  const int64_t e = 1;
  for (int up = 0; up < 2; ++up) {
    absl::StatusOr<Tensor> t = ReadGptOssExpert(
        w, 0, up ? "ffn_up" : "ffn_gate", e, kExperts, kF, kHidden);
    ASSERT_TRUE(t.ok()) << t.status();
    for (int64_t r = 0; r < kF; ++r) {
      for (int64_t c = 0; c < kHidden; ++c) {
        ASSERT_EQ(t->f32()[r * kHidden + c],
                  gate_up[(e * kHidden + c) * 2 * kF + 2 * r + up]);
      }
    }
  }
  absl::StatusOr<Tensor> t =
      ReadGptOssExpert(w, 0, "ffn_down", e, kExperts, kF, kHidden);
  ASSERT_TRUE(t.ok()) << t.status();
  for (int64_t r = 0; r < kHidden; ++r) {
    for (int64_t c = 0; c < kF; ++c) {
      ASSERT_EQ(t->f32()[r * kF + c], down[(e * kF + c) * kHidden + r]);
    }
  }
}

TEST(GptOssExpertsTest, GateAndUpBiasesAreDeinterleavedAndSliced) {
  std::vector<float> bias(kExperts * 2 * kF);
  for (size_t i = 0; i < bias.size(); ++i) bias[i] = static_cast<float>(i);
  InMemoryWeights w(SmallTestConfig());
  w.AddF32("blk.1.ffn_gate_up_exps.bias", {kExperts, 2 * kF}, bias);
  for (int up = 0; up < 2; ++up) {
    // Expert 1, columns 8..16.
    absl::StatusOr<Tensor> b =
        ReadGptOssGateUpBias(w, 1, up, kExperts, kF, 1, 2, 8, 16);
    ASSERT_TRUE(b.ok()) << b.status();
    ASSERT_EQ(b->shape(), (Shape{1, 8}));
    for (int64_t c = 0; c < 8; ++c) {
      EXPECT_EQ(b->f32()[c], bias[2 * kF + 2 * (8 + c) + up]);
    }
  }
}

TEST(GptOssExpertsTest, WrongShapesAreRefusedNamingTheTensor) {
  InMemoryWeights w(SmallTestConfig());
  w.AddRaw("blk.0.ffn_gate_up_exps.blocks", DType::kI8,
           {kExperts, 2 * kF, kHidden / 32, 16},
           std::vector<uint8_t>(kExperts * 2 * kF * kHidden / 2));
  // The scales' last dimension is one block short.
  w.AddRaw("blk.0.ffn_gate_up_exps.scales", DType::kI8,
           {kExperts, 2 * kF, kHidden / 32 - 1},
           std::vector<uint8_t>(kExperts * 2 * kF * (kHidden / 32 - 1)));
  const absl::Status s = CheckGptOssExperts(w, 0, kExperts, kF, kHidden);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("blk.0.ffn_gate_up_exps.scales"),
            std::string::npos)
      << s;
  EXPECT_FALSE(
      ReadGptOssExpert(w, 0, "ffn_gate", 0, kExperts, kF, kHidden).ok());
  // Gate and up whole, the down projection missing.
  InMemoryWeights no_down(SmallTestConfig());
  no_down.AddRaw("blk.0.ffn_gate_up_exps.blocks", DType::kI8,
                 {kExperts, 2 * kF, kHidden / 32, 16},
                 std::vector<uint8_t>(kExperts * 2 * kF * kHidden / 2));
  no_down.AddRaw("blk.0.ffn_gate_up_exps.scales", DType::kI8,
                 {kExperts, 2 * kF, kHidden / 32},
                 std::vector<uint8_t>(kExperts * 2 * kF * kHidden / 32));
  const absl::Status missing =
      CheckGptOssExperts(no_down, 0, kExperts, kF, kHidden);
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound) << missing;
  EXPECT_NE(missing.message().find("blk.0.ffn_down_exps.blocks"),
            std::string::npos)
      << missing;
}

}  // namespace
}  // namespace shardlm
