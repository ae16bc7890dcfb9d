#include "model/model_config.h"

#include "gtest/gtest.h"

namespace shardlm {
namespace {

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
  c.n_kv_heads = 2;  // 9 query heads cannot be grouped over 2.
  EXPECT_NE(c.Validate().message().find("n_kv_heads"), std::string::npos);
  c = SmolLm2();
  c.n_layers = 1'000'000'000;
  EXPECT_NE(c.Validate().message().find("n_layers"), std::string::npos);
  c = SmolLm2();
  c.head_dim = 63;
  EXPECT_FALSE(c.Validate().ok());
  c = SmolLm2();
  c.architecture = "gpt2";
  EXPECT_FALSE(c.Validate().ok());
  c = SmolLm2();
  c.rms_norm_eps = 0;
  EXPECT_FALSE(c.Validate().ok());
}

}  // namespace
}  // namespace shardlm
