#include "model/model_config.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/status.h"

namespace shardlm {
namespace {

using testing_util::IsError;

ModelConfig SmolLm2() {
  ModelConfig c;
  c.n_layers = 30;
  c.hidden = 576;
  c.ffn_hidden = 1536;
  c.n_heads = 9;
  c.n_kv_heads = 3;
  c.head_dim = 64;
  c.vocab_size = 49152;
  c.context_length = 8192;
  return c;
}

TEST(ModelConfigTest, AcceptsSmolLm2) {
  EXPECT_TRUE(SmolLm2().Validate().ok());
}

TEST(ModelConfigTest, RejectsInconsistentOrAbsurdValues) {
  ModelConfig c = SmolLm2();
  const auto kInvalid = absl::StatusCode::kInvalidArgument;
  c.n_kv_heads = 2;  // 9 query heads cannot be grouped over 2.
  EXPECT_TRUE(IsError(c.Validate(), kInvalid,
                      "n_heads (9) is not a multiple of n_kv_heads (2)"));
  c = SmolLm2();
  c.n_layers = 1'000'000'000;
  EXPECT_TRUE(IsError(c.Validate(), kInvalid, "n_layers"));
  c = SmolLm2();
  c.head_dim = 63;
  EXPECT_TRUE(IsError(c.Validate(), kInvalid, "head_dim 63 must be even"));
  c = SmolLm2();
  c.architecture = "gpt2";
  EXPECT_TRUE(
      IsError(c.Validate(), kInvalid, "architecture 'gpt2' is not supported"));
  c = SmolLm2();
  c.rms_norm_eps = 0;
  EXPECT_TRUE(IsError(c.Validate(), kInvalid,
                      "rope_theta and rms_norm_eps must be positive"));
}

// The scaling types' defining properties (the values themselves are checked
// end to end against the numpy reference and llama.cpp in
// tests/reference, family_* tests).
TEST(ModelConfigTest, Glm45PartsAreChecked) {
  const auto kInvalid = absl::StatusCode::kInvalidArgument;
  ModelConfig c = SmolLm2();
  c.architecture = "glm4moe";
  c.n_experts = 8;
  c.n_experts_used = 2;
  c.expert_ffn_hidden = 64;
  c.expert_gating = ExpertGating::kSigmoid;
  c.expert_groups = 2;
  c.expert_groups_used = 1;
  c.n_shared_experts = 1;
  c.n_dense_layers = 1;
  c.rope_dims = 32;
  ASSERT_TRUE(c.Validate().ok()) << c.Validate();
  EXPECT_EQ(c.RotaryDims(), 32);
  EXPECT_EQ(c.Rope().inv_freq.size(), 16u);  // Pairs of the rotary part.
  EXPECT_FALSE(c.LayerIsMoe(0));
  EXPECT_TRUE(c.LayerIsMoe(1));
  EXPECT_EQ(c.SharedFfn(), 64);
  ModelConfig bad = c;
  bad.expert_groups = 3;  // 8 experts do not split into 3 groups.
  EXPECT_TRUE(IsError(bad.Validate(), kInvalid, "expert groups"));
  bad = c;
  bad.n_experts_used = 5;  // One group of 4 cannot hold 5.
  EXPECT_TRUE(IsError(bad.Validate(), kInvalid, "cannot hold the top 5"));
  bad = c;
  bad.rope_dims = 33;
  EXPECT_TRUE(IsError(bad.Validate(), kInvalid, "rope_dims 33"));
  bad = c;
  bad.n_dense_layers = 31;
  EXPECT_TRUE(IsError(bad.Validate(), kInvalid, "n_dense_layers"));
  bad = SmolLm2();
  bad.n_shared_experts = 1;  // Shared experts without experts.
  EXPECT_TRUE(IsError(bad.Validate(), kInvalid, "without experts"));
}

TEST(ModelConfigTest, LatentAttentionIsChecked) {
  const auto kInvalid = absl::StatusCode::kInvalidArgument;
  ModelConfig c = SmolLm2();
  c.architecture = "deepseek2";
  c.n_kv_heads = c.n_heads;
  c.kv_lora_rank = 32;
  c.q_lora_rank = 48;
  c.v_head_dim = 12;
  c.rope_dims = 16;
  ASSERT_TRUE(c.Validate().ok()) << c.Validate();
  EXPECT_TRUE(c.is_mla());
  EXPECT_EQ(c.CachedHeads(), 1);
  EXPECT_EQ(c.CachedHeadDim(), 32 + 16);
  ModelConfig bad = c;
  bad.rope_dims = 0;  // No RoPE part.
  EXPECT_TRUE(IsError(bad.Validate(), kInvalid, "latent attention needs"));
  bad = c;
  bad.n_kv_heads = 3;  // Latent attention has no KV head groups.
  EXPECT_TRUE(IsError(bad.Validate(), kInvalid, "n_kv_heads = n_heads"));
  bad = c;
  bad.v_head_dim = 0;
  EXPECT_TRUE(IsError(bad.Validate(), kInvalid, "v_head_dim"));
  bad = c;
  bad.attn_scale_factor = 0;
  EXPECT_TRUE(IsError(bad.Validate(), kInvalid, "attn_scale_factor"));
}

// Qwen3.5's layout (make_family_models.py's qwen35): every fourth layer
// attends, the others are Gated DeltaNet layers.
TEST(ModelConfigTest, HybridLayersAreChecked) {
  const auto kInvalid = absl::StatusCode::kInvalidArgument;
  ModelConfig c = SmolLm2();
  c.architecture = "qwen35";
  c.n_layers = 8;
  c.linear_layers = {true, true, true, false, true, true, true, false};
  c.ssm_conv_width = 4;
  c.ssm_k_heads = 2;
  c.ssm_k_dim = 16;
  c.ssm_v_heads = 4;
  c.ssm_v_dim = 16;
  ASSERT_TRUE(c.Validate().ok()) << c.Validate();
  EXPECT_TRUE(c.LayerIsLinear(0));
  EXPECT_FALSE(c.LayerIsLinear(3));
  EXPECT_EQ(c.AttentionLayers(0, 8), 2);
  EXPECT_EQ(c.AttentionLayers(4, 7), 0);
  // q and k of 2 x 16, v of 4 x 16: 128 channels; the convolution keeps
  // 3 inputs of them, and each value head a 16 x 16 state.
  EXPECT_EQ(c.SsmConvChannels(), 128);
  EXPECT_EQ(c.SsmStateValues(), 3 * 128 + 4 * 16 * 16);
  EXPECT_THAT(c.DebugString(),
              ::testing::HasSubstr("Gated DeltaNet in 6 of 8 layers "
                                   "(attention in 3, 7)"));

  ModelConfig bad = c;
  bad.ssm_v_heads = 3;
  EXPECT_TRUE(IsError(bad.Validate(), kInvalid,
                      "ssm_v_heads (3) is not a multiple of ssm_k_heads (2)"));
  bad = c;
  bad.linear_layers.pop_back();
  EXPECT_TRUE(IsError(bad.Validate(), kInvalid,
                      "linear_layers has 7 entries for 8 layers"));
  bad = c;
  bad.ssm_conv_width = 0;
  EXPECT_TRUE(IsError(bad.Validate(), kInvalid, "ssm_conv_width = 0"));
  // A dense model has no linear layers.
  EXPECT_FALSE(SmolLm2().is_hybrid());
  EXPECT_EQ(SmolLm2().AttentionLayers(0, 30), 30);
}

TEST(RopeTableTest, ScalingTypesStretchTheRightFrequencies) {
  constexpr int64_t kDim = 64;
  const RopeTable plain =
      MakeRopeTable(RopeStyle::kRotateHalf, 500000.0f, kDim, {});
  EXPECT_TRUE(plain.plain);
  EXPECT_EQ(plain.inv_freq.size(), size_t{kDim / 2});
  EXPECT_DOUBLE_EQ(plain.inv_freq[0], 1.0);
  EXPECT_NEAR(plain.inv_freq[1], std::pow(500000.0, -2.0 / kDim), 1e-15);

  RopeScaling linear{.type = RopeScalingType::kLinear, .factor = 4};
  const RopeTable lin =
      MakeRopeTable(RopeStyle::kRotateHalf, 500000.0f, kDim, linear);
  EXPECT_FALSE(lin.plain);
  for (int64_t k = 0; k < kDim / 2; ++k) {
    EXPECT_DOUBLE_EQ(lin.inv_freq[k], plain.inv_freq[k] / 4);
  }

  // Llama 3.1: wavelengths under 8192 / 4 kept, over 8192 / 1 divided by
  // 8, a ramp between.
  RopeScaling llama3{.type = RopeScalingType::kLlama3,
                     .factor = 8,
                     .original_context = 8192,
                     .low_freq_factor = 1,
                     .high_freq_factor = 4};
  ASSERT_TRUE(ValidateRopeScaling(llama3, kDim).ok());
  const RopeTable l3 =
      MakeRopeTable(RopeStyle::kRotateHalf, 500000.0f, kDim, llama3);
  int kept = 0, divided = 0, between = 0;
  for (int64_t k = 0; k < kDim / 2; ++k) {
    const double wavelen = 2 * M_PI / plain.inv_freq[k];
    if (wavelen < 2048) {
      EXPECT_DOUBLE_EQ(l3.inv_freq[k], plain.inv_freq[k]);
      ++kept;
    } else if (wavelen > 8192) {
      EXPECT_DOUBLE_EQ(l3.inv_freq[k], plain.inv_freq[k] / 8);
      ++divided;
    } else {
      EXPECT_LT(l3.inv_freq[k], plain.inv_freq[k]);
      EXPECT_GT(l3.inv_freq[k], plain.inv_freq[k] / 8);
      ++between;
    }
  }
  EXPECT_GT(kept * divided * between, 0);

  // YaRN: the fastest pair extrapolates, the slowest interpolates, and
  // cos/sin grow by 0.1 ln(factor) + 1.
  RopeScaling yarn{
      .type = RopeScalingType::kYarn, .factor = 4, .original_context = 4096};
  const RopeTable y =
      MakeRopeTable(RopeStyle::kRotateHalf, 10000.0f, kDim, yarn);
  const RopeTable y0 =
      MakeRopeTable(RopeStyle::kRotateHalf, 10000.0f, kDim, {});
  EXPECT_DOUBLE_EQ(y.inv_freq[0], y0.inv_freq[0]);
  EXPECT_DOUBLE_EQ(y.inv_freq[kDim / 2 - 1], y0.inv_freq[kDim / 2 - 1] / 4);
  EXPECT_DOUBLE_EQ(y.mscale, 0.1 * std::log(4.0) + 1);
  // gpt-oss's truncate false: the ramp runs between the fractional
  // correction dims (transformers' find_correction_range), not the whole
  // ones around them. kDim 64, base 10000, original 4096: 10.5 .. 22.5 of
  // the 32 pairs.
  RopeScaling untruncated = yarn;
  untruncated.truncate = false;
  const RopeTable u =
      MakeRopeTable(RopeStyle::kRotateHalf, 10000.0f, kDim, untruncated);
  const auto corr = [](double rotations) {
    return kDim * std::log(4096 / (rotations * 2 * std::numbers::pi)) /
           (2 * std::log(10000.0));
  };
  const double lo = corr(32), hi = corr(1);
  for (int64_t k = 0; k < kDim / 2; ++k) {
    const double ramp = std::clamp((k - lo) / (hi - lo), 0.0, 1.0);
    const double f = y0.inv_freq[k];
    EXPECT_NEAR(u.inv_freq[k], f / 4 * ramp + f * (1 - ramp), 1e-15 * f) << k;
  }
  EXPECT_NE(u.inv_freq[16], y.inv_freq[16]);  // Inside the ramp: differs.

  // Static NTK: plain RoPE over a larger base (so the CUDA kernel can run
  // it from theta), transformers' dynamic base at 2.5 x the original
  // context: 10000 (2.5^2 - 1.5)^(64 / 62). Factor 1 changes nothing.
  RopeScaling ntk{.type = RopeScalingType::kDynamic,
                  .factor = 2.5,
                  .original_context = 4096};
  ASSERT_TRUE(ValidateRopeScaling(ntk, kDim).ok());
  const RopeTable n =
      MakeRopeTable(RopeStyle::kRotateHalf, 10000.0f, kDim, ntk);
  const double base = 10000.0 * std::pow(4.75, 64.0 / 62.0);
  EXPECT_TRUE(n.plain);
  EXPECT_FLOAT_EQ(n.theta, static_cast<float>(base));
  for (int64_t k = 0; k < kDim / 2; ++k) {
    EXPECT_NEAR(n.inv_freq[k], std::pow(base, -2.0 * k / kDim),
                1e-14 * y0.inv_freq[k]);
    if (k > 0) EXPECT_LT(n.inv_freq[k], y0.inv_freq[k]);
  }
  ntk.factor = 1;
  const RopeTable n1 =
      MakeRopeTable(RopeStyle::kRotateHalf, 10000.0f, kDim, ntk);
  EXPECT_EQ(n1.theta, 10000.0f);
  EXPECT_EQ(n1.inv_freq, y0.inv_freq);

  // GGUF's rope_freqs divide whatever else applies.
  RopeScaling factors;
  factors.freq_factors.assign(kDim / 2, 2.0f);
  const RopeTable f =
      MakeRopeTable(RopeStyle::kRotateHalf, 500000.0f, kDim, factors);
  EXPECT_FALSE(f.plain);
  EXPECT_DOUBLE_EQ(f.inv_freq[3], plain.inv_freq[3] / 2);
}

TEST(RopeTableTest, ValidateNamesTheBadParameter) {
  RopeScaling s{.type = RopeScalingType::kLlama3, .factor = 8};
  EXPECT_THAT(ValidateRopeScaling(s, 64).message(),
              testing::HasSubstr("original_max_position_embeddings"));
  s = {.type = RopeScalingType::kLinear, .factor = 0.5};
  EXPECT_THAT(ValidateRopeScaling(s, 64).message(),
              testing::HasSubstr("factor"));
  s = {};
  s.freq_factors = {1.0f, 2.0f};
  EXPECT_THAT(ValidateRopeScaling(s, 64).message(),
              testing::HasSubstr("freq_factors"));
  s = {.type = RopeScalingType::kDynamic, .factor = 2};
  EXPECT_THAT(ValidateRopeScaling(s, 64).message(),
              testing::HasSubstr("original_max_position_embeddings"));
  s.original_context = 4096;
  EXPECT_THAT(ValidateRopeScaling(s, 2).message(),
              testing::HasSubstr("head_dim > 2"));
  EXPECT_EQ(*ParseRopeScalingType("dynamic"), RopeScalingType::kDynamic);
  EXPECT_THAT(ParseRopeScalingType("longrope").status().message(),
              testing::HasSubstr("'longrope' is not supported"));
  EXPECT_EQ(*ParseRopeScalingType("default"), RopeScalingType::kNone);
}

}  // namespace
}  // namespace shardlm
